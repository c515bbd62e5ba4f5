package pglocks_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// internalRef matches words that name the project's own history — design
// seeds ("seed 000", "seed 761ad25b"), the findings of its reviews and
// their ids (B7, C2, r12; in parentheses or bare), issue numbers — which
// mean nothing to a reader of go doc, README or docs. The ids are
// case-sensitive (B7, not b7), the words are not.
var internalRef = regexp.MustCompile(`(?i:\bseeds? [0-9a-f]*\d[0-9a-f]*\b|\breview(?:s|'s|ed|er)?\b|\bfindings? [A-Z]?\d|\bissue #?\d+)` +
	`|\b[BC]\d{1,2}\b|\b[rR]\d{1,3}\b`)

// externalIssue matches the end of a text that names another project's
// issue ("pgpool2 issue 172"): a fact a reader can look up, not our
// history.
var externalIssue = regexp.MustCompile(`(?i)\b(?:pgpool2?|pgbouncer|pgx|postgres(?:ql)?|golang|go) issue #?\d+$`)

// internalRefs returns the references to the project's history in text.
func internalRefs(text string) []string {
	var out []string
	for _, loc := range internalRef.FindAllStringIndex(text, -1) {
		if !externalIssue.MatchString(text[:loc[1]]) {
			out = append(out, text[loc[0]:loc[1]])
		}
	}
	return out
}

// TestInternalRefs pins what internalRefs finds and what it lets pass.
func TestInternalRefs(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]string{
		"as seed 000 showed":               "seed 000",
		"the maintainers of seed 761ad25b": "seed 761ad25b",
		"review finding B7":                "review",
		"fixed (B18).":                     "B18",
		"fixed B7 too":                     "B7",
		"see r5 and r123":                  "r5",
		"the second review's C7":           "review's",
		"closes issue 28":                  "issue 28",
		"pgpool2 issue 172, and issue 9":   "issue 9",
	} {
		if got := internalRefs(text); len(got) == 0 || got[0] != want {
			t.Errorf("internalRefs(%q) = %q, want first %q", text, got, want)
		}
	}
	for _, text := range []string{
		"commits (pgpool2 issue 172; pinned by TestPgpoolLeavesDMLOpen)",
		"Faults are drawn from a seed (printed; CHAOS_SEED replays the same schedule)",
		"Each run prints its seed and a summary", "CHAOS_SEED=1234 go test ./chaos/",
		"Bob Jenkins' lookup3 with a 64-bit seed, for a little-endian server",
		"B-tree index", "b7 in lower case", "0xC1", "x86_64", "SQLSTATE 40001",
	} {
		if got := internalRefs(text); len(got) > 0 {
			t.Errorf("internalRefs(%q) = %q, want none", text, got)
		}
	}
}

// TestDocsSayTheThingItself: no comment in the module's Go files (package
// docs and doc comments, which go doc shows, and the comments of tests),
// and nothing in README.md and docs/*.md, refers to the project's internal
// history; a sentence says the thing itself. The names of guarantees and
// of the tests that hold them are fine.
func TestDocsSayTheThingItself(t *testing.T) {
	t.Parallel()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		switch {
		case d.IsDir() || path == "doc_hygiene_test.go":
			return nil
		case path == "README.md" || filepath.Dir(path) == "docs" && strings.HasSuffix(path, ".md"):
			return checkText(t, path)
		case strings.HasSuffix(path, ".go"):
			return checkComments(t, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkText reports the references to the project's history in the text
// file at path, by line.
func checkText(t *testing.T, path string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for i, line := range strings.Split(string(src), "\n") {
		for _, m := range internalRefs(line) {
			t.Errorf("%s:%d: %q in %q", path, i+1, m, strings.TrimSpace(line))
		}
	}
	return nil
}

// checkComments reports the references to the project's history in the
// comments of the Go file at path.
func checkComments(t *testing.T, path string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return err
	}
	for _, g := range f.Comments {
		for _, c := range g.List {
			for _, m := range internalRefs(c.Text) {
				t.Errorf("%s: %q in %q", fset.Position(c.Pos()), m, strings.TrimSpace(c.Text))
			}
		}
	}
	return nil
}
