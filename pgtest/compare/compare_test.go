package compare

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // pgtestdb's driver
	"github.com/peterldowns/pgtestdb"
	"github.com/pglocks/pglocks/pgtest"
)

// schema is the suite's migrations, the same for both harnesses.
const schema = `
create table users (id bigserial primary key, email text not null unique, created_at timestamptz not null default now());
create table orders (id bigserial primary key, user_id bigint not null references users, total numeric(12,2) not null);
create index on orders (user_id);
create table audit (id bigserial primary key, at timestamptz not null default now(), what jsonb);
`

var files = fstest.MapFS{"migrations/001_schema.sql": {Data: []byte(schema)}}

// sqlMigrator is the suite's migrations for pgtestdb.
type sqlMigrator struct{}

func (sqlMigrator) Hash() (string, error) {
	return pgtest.HashFiles(files, "compare", []string{"migrations/001_schema.sql"})
}

func (sqlMigrator) Migrate(ctx context.Context, db *sql.DB, _ pgtestdb.Config) error {
	_, err := db.ExecContext(ctx, schema)
	return err
}

const tests = 20

// suite runs the 20 tests, each timing its database (made, connected, a
// table queried) with get, and prints "DB <µs>" lines.
func suite(t *testing.T, get func(t *testing.T) string) {
	var mu sync.Mutex
	var took []time.Duration
	t.Run("Suite", func(t *testing.T) {
		for i := range tests {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				dsn := get(t)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				conn, err := pgx.Connect(ctx, dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close(ctx)
				if _, err := conn.Exec(ctx, "insert into users (email) values ($1)", t.Name()); err != nil {
					t.Fatal(err)
				}
				d := time.Since(start)
				mu.Lock()
				took = append(took, d)
				mu.Unlock()
			})
		}
	})
	for _, d := range took {
		fmt.Printf("DB %d\n", d.Microseconds())
	}
}

func TestSuitePgtest(t *testing.T) {
	if os.Getenv("COMPARE_SUITE") == "" {
		t.Skip("run by TestCompare")
	}
	m := pgtest.WithMigrator(pgtest.SQLFiles(files, "migrations/*.sql"))
	suite(t, func(t *testing.T) string { return pgtest.New(t, m).DSN })
}

func TestSuitePgtestdb(t *testing.T) {
	if os.Getenv("COMPARE_SUITE") == "" {
		t.Skip("run by TestCompare")
	}
	cfg, err := pgx.ParseConfig(os.Getenv("PGTEST_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	conf := pgtestdb.Config{DriverName: "pgx", Host: cfg.Host, Port: strconv.Itoa(int(cfg.Port)),
		User: cfg.User, Password: cfg.Password, Database: cfg.Database, Options: "sslmode=disable"}
	suite(t, func(t *testing.T) string { return pgtestdb.Custom(t, conf, sqlMigrator{}).URL() })
}

// TestCompare runs the two suites in turn, each in its own test binary
// process as a user's `go test` would, PGTEST_COMPARE rounds, and reports.
func TestCompare(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("PGTEST_COMPARE"))
	if rounds <= 0 {
		t.Skip("PGTEST_COMPARE=rounds runs the comparison")
	}
	dsn := os.Getenv("PGTEST_DSN")
	if dsn == "" {
		srv, err := pgtest.Start(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		dsn = srv.DSN()
		t.Logf("server: %s", srv)
	}
	names := []string{"pgtest", "pgtestdb"}
	per := map[string][]time.Duration{}
	wall := map[string][]time.Duration{}
	for r := range rounds {
		order := names
		if r%2 == 1 {
			order = []string{names[1], names[0]}
		}
		for _, name := range order {
			took, w := runSuite(t, dsn, name)
			per[name] = append(per[name], took...)
			wall[name] = append(wall[name], w)
		}
	}
	for _, name := range names {
		t.Logf("%-8s per-test database p50 %v p95 %v (n=%d); suite wall time p50 %v (%d rounds)", name,
			pct(per[name], 50), pct(per[name], 95), len(per[name]), pct(wall[name], 50), rounds)
	}
}

// runSuite runs one suite in a child process and returns its per-test
// database times and its wall time.
func runSuite(t *testing.T, dsn, name string) ([]time.Duration, time.Duration) {
	cmd := exec.Command(os.Args[0], "-test.run", "^TestSuite"+strings.ToUpper(name[:1])+name[1:]+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "COMPARE_SUITE=1", "PGTEST_DSN="+dsn)
	start := time.Now()
	out, err := cmd.Output()
	w := time.Since(start)
	if err != nil {
		t.Fatalf("%s suite: %v\n%s", name, err, out)
	}
	var took []time.Duration
	for sc := bufio.NewScanner(strings.NewReader(string(out))); sc.Scan(); {
		if us, ok := strings.CutPrefix(sc.Text(), "DB "); ok {
			n, _ := strconv.Atoi(us)
			took = append(took, time.Duration(n)*time.Microsecond)
		}
	}
	if len(took) != tests {
		t.Fatalf("%s suite: %d of %d tests timed\n%s", name, len(took), tests, out)
	}
	return took, w
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(100 * time.Microsecond)
}

func TestMain(m *testing.M) { pgtest.Main(m) }
