// Command benchtable turns one run of .ci/bench into docs/performance.md's
// performance table, so that every figure in it comes from that one run.
//
//	go run ./.ci/benchtable DIR            # print the table
//	go run ./.ci/benchtable -w DIR docs/performance.md  # replace it there
//
// DIR holds the raw `go test -bench` outputs that .ci/bench writes (one file
// per group, named as there). Each figure is the median of the runs; a ratio
// of two benchmarks (ours and raw) is the median of the ratios of their i-th
// runs, which .ci/bench makes in one pass, one after the other. In docs/performance.md
// the table sits between the lines <!-- bench:begin --> and
// <!-- bench:end -->.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// results maps a group (file name without .txt), a benchmark name (without
// the GOMAXPROCS suffix) and a unit to the values of its runs, in order.
type results map[string]map[string]map[string][]float64

var suffix = regexp.MustCompile(`-\d+$`)

func load(dir string) (results, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no results in %s (%v)", dir, err)
	}
	r := results{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		group := strings.TrimSuffix(filepath.Base(f), ".txt")
		r[group] = map[string]map[string][]float64{}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			name, vals, ok := parse(sc.Text())
			if !ok {
				if strings.HasPrefix(sc.Text(), "Benchmark") {
					fmt.Fprintf(os.Stderr, "%s: skipped, not a result: %q\n", f, sc.Text())
				}
				continue
			}
			if r[group][name] == nil {
				r[group][name] = map[string][]float64{}
			}
			for unit, v := range vals {
				r[group][name][unit] = append(r[group][name][unit], v)
			}
		}
	}
	return r, nil
}

// parse reads one result line: "BenchmarkName-2  N  value unit  value
// unit …". A line that a failure or a log wrote into (go test prints a
// benchmark's name before it runs) is not one.
func parse(line string) (name string, vals map[string]float64, ok bool) {
	fs := strings.Fields(line)
	if len(fs) < 4 || len(fs)%2 != 0 || !strings.HasPrefix(fs[0], "Benchmark") {
		return "", nil, false
	}
	if _, err := strconv.ParseInt(fs[1], 10, 64); err != nil {
		return "", nil, false
	}
	vals = map[string]float64{}
	for i := 2; i+1 < len(fs); i += 2 {
		v, err := strconv.ParseFloat(fs[i], 64)
		if err != nil {
			return "", nil, false
		}
		vals[fs[i+1]] = v
	}
	return suffix.ReplaceAllString(strings.TrimPrefix(fs[0], "Benchmark"), ""), vals, true
}

// table builds the rows; a figure that is missing from the run is
// reported, not guessed.
type table struct {
	r       results
	missing []string
}

func (t *table) vals(group, name, unit string) []float64 {
	v := t.r[group][name][unit]
	if len(v) == 0 {
		t.missing = append(t.missing, group+": "+name+" "+unit)
	}
	return v
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// med is the median of a benchmark's unit.
func (t *table) med(group, name, unit string) float64 { return median(t.vals(group, name, unit)) }

// ratioSpan is the median of the per-run ratios a/b of two benchmarks of
// a group — the i-th run of each, which .ci/bench runs in the same pass,
// one after the other — with their range: "1.05 (0.98–1.12)". A single
// run's figure says too little on a noisy machine. Series of unequal
// length are reported as missing.
func (t *table) ratioSpan(group, a, b, unit string) string { return span(t.ratios(group, a, b, unit)) }

// medSpan is med with the range of the runs, as ratioSpan.
func (t *table) medSpan(group, name, unit string) string { return span(t.vals(group, name, unit)) }

// span formats the median of xs and, when the runs differ, their range.
func span(xs []float64) string {
	if len(xs) == 0 {
		return "—"
	}
	lo, hi := slices.Min(xs), slices.Max(xs)
	if f2(lo) == f2(hi) {
		return f2(median(xs))
	}
	return f2(median(xs)) + " (" + f2(lo) + "–" + f2(hi) + ")"
}

// ratios are the per-run ratios a/b of two benchmarks of a group.
func (t *table) ratios(group, a, b, unit string) []float64 {
	va, vb := t.vals(group, a, unit), t.vals(group, b, unit)
	if len(va) != len(vb) {
		t.missing = append(t.missing, fmt.Sprintf("%s: %s and %s: %d and %d runs", group, a, b, len(va), len(vb)))
	}
	var rs []float64
	for i := range min(len(va), len(vb)) {
		if vb[i] != 0 {
			rs = append(rs, va[i]/vb[i])
		}
	}
	return rs
}

// each formats f(n) for n in ns, joined by " / ".
func each[T any](ns []T, f func(T) string) string {
	var s []string
	for _, n := range ns {
		s = append(s, f(n))
	}
	return strings.Join(s, " / ")
}

// k formats a rate: 7.4k, 950.
func k(v float64) string {
	if v >= 1000 {
		return strconv.FormatFloat(v/1000, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

func main() {
	write := flag.Bool("w", false, "replace the table in the file given after DIR (docs/performance.md)")
	flag.Parse()
	if flag.NArg() < 1 || (*write && flag.NArg() != 2) {
		fmt.Fprintln(os.Stderr, "usage: benchtable DIR | benchtable -w DIR docs/performance.md")
		os.Exit(2)
	}
	r, err := load(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	t := &table{r: r}
	out := t.rows()
	if len(t.missing) > 0 {
		fmt.Fprintln(os.Stderr, "missing from the run:\n  "+strings.Join(t.missing, "\n  "))
		os.Exit(1)
	}
	if !*write {
		fmt.Print(out)
		return
	}
	if err := replace(flag.Arg(1), out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// replace puts table between the markers of docs/performance.md.
func replace(readme, table string) error {
	b, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	const begin, end = "<!-- bench:begin -->\n", "<!-- bench:end -->"
	i, j := bytes.Index(b, []byte(begin)), bytes.Index(b, []byte(end))
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %q … %q block", readme, strings.TrimSpace(begin), end)
	}
	out := slices.Concat(b[:i+len(begin)], []byte(table), b[j:])
	return os.WriteFile(readme, out, 0o644)
}
