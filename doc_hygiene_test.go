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
// seeds, review findings and their ids, issue numbers — which mean
// nothing to a reader of go doc.
var internalRef = regexp.MustCompile(`(?i)\bseed 00\d|\breview\b|\bfinding [A-Z]?\d|\((?:[BC]\d{1,2}|r\d{2})(?:,\s*(?:[BC]\d{1,2}|r\d{2}))*\)|\br\d{2}\b|\bissue \d+`)

// TestDocsSayTheThingItself: no comment in the module's non-test Go files
// (package docs and doc comments, which go doc shows) refers to the
// project's internal history; a sentence says the thing itself. The
// names of guarantees and of the tests that hold them are fine.
func TestDocsSayTheThingItself(t *testing.T) {
	t.Parallel()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
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
				if m := internalRef.FindString(c.Text); m != "" {
					t.Errorf("%s: %q in %q", fset.Position(c.Pos()), m, strings.TrimSpace(c.Text))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
