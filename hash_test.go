package pglocks_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.WrapMain(m)) }

// Golden values of hashtextextended(name, 0), read off PostgreSQL 15. They
// pin the algorithm: a change here breaks every key users have in the wild.
var golden = []struct {
	name string
	key  int64
}{
	{"", -6939563903564495251},
	{"a", 3591986179850072241},
	{"report:monthly", -6377036543226593914},
	{"abcdefghijkl", -7556637188122330412},
	{"héllo wörld ✓ 日本語", -4081831178708560169},
}

func TestKeyOfGolden(t *testing.T) {
	t.Parallel()
	for _, g := range golden {
		if got := pglocks.KeyOf(g.name).Int64(); got != g.key {
			t.Errorf("KeyOf(%q) = %d, want %d", g.name, got, g.key)
		}
	}
}

// serverHashes asks the server for hashtextextended(name, 0) of every name,
// in one round trip.
func serverHashes(t testing.TB, conn *pgx.Conn, names []string) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := conn.Query(ctx,
		"select hashtextextended(n, 0) from unnest($1::text[]) with ordinality as u(n, i) order by i", names)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// randomName returns n random runes: ASCII, 2-, 3- and 4-byte UTF-8, no NUL.
func randomName(r *rand.Rand, n int) string {
	ranges := [][2]rune{{1, 0x7f}, {0x80, 0x7ff}, {0x800, 0xd7ff}, {0xe000, 0xffff}, {0x10000, 0x10ffff}}
	var b strings.Builder
	for range n {
		rg := ranges[r.IntN(len(ranges))]
		b.WriteRune(rg[0] + rune(r.IntN(int(rg[1]-rg[0]+1))))
	}
	return b.String()
}

func TestKeyOfMatchesServer(t *testing.T) {
	t.Parallel()
	conn := pgtest.New(t).Conn(t)
	r := rand.New(rand.NewPCG(1, 2))
	var names []string
	// Every byte length 0–64 in ASCII, and every rune length in mixed UTF-8,
	// many times over: the hash consumes 12-byte blocks and an 0–11 byte tail.
	for n := 0; n <= 64; n++ {
		for range 80 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(1 + r.IntN(127))
			}
			names = append(names, string(b))
			names = append(names, randomName(r, n))
		}
	}
	for len(names) < 12000 {
		names = append(names, randomName(r, r.IntN(200)))
	}
	want := serverHashes(t, conn, names)
	for i, name := range names {
		if got := pglocks.KeyOf(name).Int64(); got != want[i] {
			t.Fatalf("KeyOf(%q) = %d, server says %d", name, got, want[i])
		}
	}
	t.Logf("%d names agree with the server", len(names))
}

func TestKeyOfMatchesServerHugeName(t *testing.T) {
	t.Parallel()
	conn := pgtest.New(t).Conn(t)
	huge := randomName(rand.New(rand.NewPCG(3, 4)), 400_000)
	for len(huge) < 1<<20 {
		huge += "x"
	}
	huge = huge[:1<<20]
	for !utf8.ValidString(huge) { // cut through a rune: trim it
		huge = huge[:len(huge)-1]
	}
	want := serverHashes(t, conn, []string{huge})[0]
	if got := pglocks.KeyOf(huge).Int64(); got != want {
		t.Fatalf("KeyOf(1 MiB name) = %d, server says %d", got, want)
	}
}

// FuzzKeyOf compares KeyOf with the server for names PostgreSQL text can
// hold. Run it with: go test -run '^$' -fuzz FuzzKeyOf .
func FuzzKeyOf(f *testing.F) {
	for _, g := range golden {
		f.Add(g.name)
	}
	conn := pgtest.New(f).Conn(f)
	f.Fuzz(func(t *testing.T, name string) {
		if pglocks.ValidateName(name) != nil && name != "" {
			t.Skip("not storable in PostgreSQL text")
		}
		if got, want := pglocks.KeyOf(name).Int64(), serverHashes(t, conn, []string{name})[0]; got != want {
			t.Fatalf("KeyOf(%q) = %d, server says %d", name, got, want)
		}
	})
}

// TestLockTagMatchesPgLocks takes each kind of key from plain SQL and finds
// it in pg_locks where LockTag says it is.
func TestLockTagMatchesPgLocks(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	holder, observer := db.Conn(t), db.Conn(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	keys := []pglocks.Key{
		pglocks.KeyOf("report:monthly"), pglocks.Int64Key(-1), pglocks.Int64Key(1 << 40),
		pglocks.PairKey(-7, 9), pglocks.PairKey(1, 2),
	}
	for _, k := range keys {
		sql := "select pg_advisory_lock(" + k.SQL() + ")"
		if _, err := holder.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		classid, objid, objsubid := k.LockTag()
		var n int
		err := observer.QueryRow(ctx, `select count(*) from pg_locks where locktype = 'advisory'
			and classid = $1 and objid = $2 and objsubid = $3 and pid = $4`,
			classid, objid, objsubid, int32(holder.PgConn().PID())).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("key %v (%s): LockTag %d/%d/%d not found in pg_locks", k, k.SQL(), classid, objid, objsubid)
		}
	}
	// PairKey(1, 2) and Int64Key(1<<32|2) are different locks.
	var got bool
	if err := observer.QueryRow(ctx, "select pg_try_advisory_lock(4294967298)").Scan(&got); err != nil || !got {
		t.Errorf("bigint 1<<32|2 should be free while the pair (1,2) is held: %v, %v", got, err)
	}
}

func TestKeyAccessors(t *testing.T) {
	t.Parallel()
	k := pglocks.KeyOf("report:monthly")
	if name, ok := k.Name(); !ok || name != "report:monthly" {
		t.Errorf("Name() = %q, %v", name, ok)
	}
	if k.Space() != pglocks.SpaceInt64 {
		t.Errorf("Space() = %v", k.Space())
	}
	if _, _, ok := k.Pair(); ok {
		t.Error("a named key reports a pair")
	}
	p := pglocks.PairKey(-7, 9)
	if hi, lo, ok := p.Pair(); !ok || hi != -7 || lo != 9 {
		t.Errorf("Pair() = %d, %d, %v", hi, lo, ok)
	}
	if p.Space() != pglocks.SpaceInt32Pair || p.Space().String() != "int32pair" {
		t.Errorf("pair space %v", p.Space())
	}
	for k, want := range map[pglocks.Key]string{
		pglocks.KeyOf("report:monthly"): `"report:monthly"(-6377036543226593914)`,
		pglocks.Int64Key(42):            "42",
		pglocks.PairKey(-7, 9):          "(-7,9)",
		{}:                              "Key(invalid)",
	} {
		if got := k.String(); got != want {
			t.Errorf("String() = %s, want %s", got, want)
		}
	}
	if got := pglocks.KeyOf("it's").SQL(); got != "hashtextextended('it''s', 0)" {
		t.Errorf("SQL() = %s", got)
	}
	x1, x2 := pglocks.KeyOf("x"), pglocks.KeyOf("x")
	if x1 != x2 || x1 == pglocks.Int64Key(x1.Int64()) {
		t.Error("keys must compare equal exactly when made the same way")
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		key  pglocks.Key
		want string // "" for valid
	}{
		{pglocks.KeyOf("ok"), ""},
		{pglocks.Int64Key(0), ""},
		{pglocks.PairKey(0, 0), ""},
		{pglocks.Key{}, "zero Key"},
		{pglocks.KeyOf(""), "empty name"},
		{pglocks.KeyOf("a\x00b"), "NUL byte"},
		{pglocks.KeyOf("a\xffb"), "not valid UTF-8"},
	} {
		err := tc.key.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: unexpected %v", tc.key, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, pglocks.ErrInvalidKey)):
			t.Errorf("%v: got %v, want an ErrInvalidKey saying %q", tc.key, err, tc.want)
		}
	}
}

func TestNamespace(t *testing.T) {
	t.Parallel()
	billing, err := pglocks.NewNamespace("billing")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := billing.Key("invoice:42"), pglocks.KeyOf("billing:invoice:42"); got != want {
		t.Errorf("billing.Key = %v, want %v", got, want)
	}
	reports, _ := pglocks.NewNamespace("reports")
	if billing.Key("x") == reports.Key("x") {
		t.Error("two namespaces share a key")
	}
	eu, err := billing.Sub("eu")
	if err != nil {
		t.Fatal(err)
	}
	if got := eu.Name("x"); got != "billing:eu:x" {
		t.Errorf("nested name %q", got)
	}
	if (pglocks.Namespace{}).Name("x") != "x" {
		t.Error("the zero Namespace adds a prefix")
	}
	if _, err := pglocks.NewNamespace(""); !errors.Is(err, pglocks.ErrInvalidKey) {
		t.Errorf("empty prefix: %v", err)
	}
	if _, err := billing.Sub("a\x00"); !errors.Is(err, pglocks.ErrInvalidKey) {
		t.Errorf("NUL part: %v", err)
	}
}

func BenchmarkKeyOf(b *testing.B) {
	name := "tenant:1234:report:monthly"
	for b.Loop() {
		_ = pglocks.KeyOf(name)
	}
}
