package pglocks_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// advisoryCall matches a call of one of PostgreSQL's advisory-lock
// functions in a string literal: the name followed by "(", or ending the
// literal (a statement built from pieces: "... from pg_try_advisory_lock" +
// mode + "("). The name in prose ("pg_advisory_unlock said ...") is no
// call.
var advisoryCall = regexp.MustCompile(`(\w+\.)?\bpg_(?:try_)?advisory_(?:xact_)?(?:lock|unlock)(?:_shared|_all)?(?:\(|$)`)

// unqualifiedLockCalls returns the advisory-lock calls in lit (a Go string
// literal's value) that are not pg_catalog-qualified.
func unqualifiedLockCalls(lit string) []string {
	var out []string
	for _, m := range advisoryCall.FindAllStringSubmatch(lit, -1) {
		if m[1] != "pg_catalog." {
			out = append(out, m[0])
		}
	}
	return out
}

// TestUnqualifiedLockCalls pins what unqualifiedLockCalls finds.
func TestUnqualifiedLockCalls(t *testing.T) {
	t.Parallel()
	for lit, want := range map[string]int{
		"select pg_try_advisory_lock($1)":                           1,
		"select pg_advisory_unlock_all()":                           1,
		"from pg_try_advisory_lock":                                 1,
		"select public.pg_try_advisory_xact_lock_shared($1::int8)":  1,
		"select pg_catalog.pg_try_advisory_lock($1::int8)":          0,
		"select pg_catalog.pg_advisory_unlock_shared($1::int4, $2)": 0,
		"pg_advisory_unlock said a held key was not held":           0,
		"pg_catalog.pg_try_advisory_lock":                           0,
	} {
		if got := unqualifiedLockCalls(lit); len(got) != want {
			t.Errorf("unqualifiedLockCalls(%q) = %q, want %d", lit, got, want)
		}
	}
}

// TestLockCallsQualified: every advisory-lock function pglocks calls, in
// any non-test Go source of the module, is called pg_catalog-qualified.
// Unqualified, the call resolves through the session's search_path and
// among every overload the role can reach: a schema before pg_catalog, or
// an overload taking float8 in public (which an untyped parameter
// prefers), replaces the server's function with one that need not lock
// anything (see internal/lockstmt). internal/engine/enginetest, which
// creates such replacements on purpose for tests, is exempt.
func TestLockCallsQualified(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata" || path == filepath.Join("internal", "engine", "enginetest")):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			for _, c := range unqualifiedLockCalls(lit.Value[1 : len(lit.Value)-1]) {
				t.Errorf("%s: %q: call it pg_catalog-qualified, with typed parameters (internal/lockstmt)", fset.Position(lit.Pos()), c)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
