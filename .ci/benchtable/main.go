// Command benchtable turns one run of .ci/bench into README.md's
// performance table, so that every figure in it comes from that one run.
//
//	go run ./.ci/benchtable DIR            # print the table
//	go run ./.ci/benchtable -w DIR README.md  # replace it in README.md
//
// DIR holds the raw `go test -bench` outputs that .ci/bench writes (one
// file per group, named as there). Each figure is the median of the runs
// (-count); a ratio of two benchmarks run side by side (ours and raw) is
// the median of the per-run ratios. In README.md the table sits between
// the lines <!-- bench:begin --> and <!-- bench:end -->.
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
			fs := strings.Fields(sc.Text())
			if len(fs) < 4 || !strings.HasPrefix(fs[0], "Benchmark") {
				continue
			}
			name := suffix.ReplaceAllString(strings.TrimPrefix(fs[0], "Benchmark"), "")
			if r[group][name] == nil {
				r[group][name] = map[string][]float64{}
			}
			for i := 2; i+1 < len(fs); i += 2 {
				v, err := strconv.ParseFloat(fs[i], 64)
				if err != nil {
					return nil, fmt.Errorf("%s: %q: %v", f, sc.Text(), err)
				}
				r[group][name][fs[i+1]] = append(r[group][name][fs[i+1]], v)
			}
		}
	}
	return r, nil
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

// ratio is the median of the per-run ratios a/b of two benchmarks of a
// group run side by side (the i-th run of each).
func (t *table) ratio(group, a, b, unit string) float64 {
	va, vb := t.vals(group, a, unit), t.vals(group, b, unit)
	var rs []float64
	for i := range min(len(va), len(vb)) {
		if vb[i] != 0 {
			rs = append(rs, va[i]/vb[i])
		}
	}
	return median(rs)
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
	write := flag.Bool("w", false, "replace the table in the README.md given after DIR")
	flag.Parse()
	if flag.NArg() < 1 || (*write && flag.NArg() != 2) {
		fmt.Fprintln(os.Stderr, "usage: benchtable DIR | benchtable -w DIR README.md")
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

// replace puts table between README's markers.
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
