package lease

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/pgtest"
)

// TestServerRefusesWhatChecksRefuse pins checkJSON and checkText to the
// server: each value is refused by the check exactly when PostgreSQL
// refuses it as jsonb (the metadata column) or as text (the hostname
// column). A documentation test of PostgreSQL's rules.
func TestServerRefusesWhatChecksRefuse(t *testing.T) {
	t.Parallel()
	conn := pgtest.New(t).Conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	docs := []string{
		`{"a":1}`, `"\u00e9"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00"`, `"\ud83d\u0041"`, `"x\ud83d"`,
		`"\\u0000"`, `"a\u0000b"`, `{"\u0000":1}`, "\"\xff\"", "\"\xc3\"", `"\u0041\u00e9"`,
		`1e131071`, `9.9e131071`, `1e131072`, `10e131071`, `1e-16383`, `1e-16384`, `1.0e-16383`,
		`0e-16384`, `0.0e-16383`, `0e9999999`, `0e-9999999`, `1e1073741823`, `0e1073741822`,
		`0e1073741823`, `-0`, `0.00000e5`, `123.456e-16380`, `0.1e-16382`, `0.1e-16383`, `1E+5`,
		`[` + strings.Repeat("1", 131072) + `]`, `[` + strings.Repeat("1", 131073) + `]`,
		`0.` + strings.Repeat("0", 16383), `0.` + strings.Repeat("0", 16384), `-1.5e300`,
		strings.Repeat("[", 5000) + strings.Repeat("]", 5000),
	}
	for _, doc := range docs {
		_, serr := conn.Exec(ctx, "select $1::text::jsonb", doc)
		cerr := checkJSON([]byte(doc))
		if (serr == nil) != (cerr == nil) {
			t.Errorf("%.60q: server %v, checkJSON %v", doc, serr, cerr)
		}
	}
	for _, s := range []string{"host", "hôte", "a\x00b", "\xff", "\xe2\x82", ""} {
		_, serr := conn.Exec(ctx, "select $1::text", s)
		cerr := checkText(s)
		if (serr == nil) != (cerr == nil) {
			t.Errorf("%q: server %v, checkText %v", s, serr, cerr)
		}
	}
}
