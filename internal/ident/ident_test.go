package ident_test

import (
	"strings"
	"testing"

	"github.com/pglocks/pglocks/internal/ident"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	for s, ok := range map[string]bool{
		"pglocks_leases": true, "T1": true, "_x": true, strings.Repeat("a", 63): true,
		"": false, "1abc": false, "no-dash": false, "a b": false, `x"; drop table y; --`: false,
		"é": false, strings.Repeat("a", 64): false,
	} {
		if err := ident.Check(s); (err == nil) != ok {
			t.Errorf("Check(%q) = %v, want ok=%v", s, err, ok)
		}
	}
}
