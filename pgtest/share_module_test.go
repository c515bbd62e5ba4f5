package pgtest_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A user's module of n packages for real go test runs (TestShareGoTest):
// each package's test migrates a schema through pgtest (a Migrator that
// counts its runs in a file), takes a database, and reports what its
// server says of itself; told to, it then waits on a FIFO before a second
// query.

// sharePkg is the test of each generated package; %s is its name.
const sharePkg = `package %s

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

var begin = time.Now()

const pkg = %[1]q

// counting appends a line to $SHARE_DIR/migrations each time it migrates.
type counting struct{ pgtest.Migrator }

func (c counting) Migrate(ctx context.Context, conn *pgx.Conn) error {
	if err := appendLine("migrations", pkg); err != nil {
		return err
	}
	return c.Migrator.Migrate(ctx, conn)
}

func appendLine(file, line string) error {
	f, err := os.OpenFile(filepath.Join(os.Getenv("SHARE_DIR"), file), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

var schema = counting{pgtest.SQLFiles(fstest.MapFS{
	"001_items.sql": {Data: []byte("create table items (id int primary key, name text not null)")},
}, "*.sql")}

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.WithMigrator(schema)) }

func TestShare(t *testing.T) {
	db := pgtest.New(t)
	first := time.Since(begin)
	ctx := context.Background()
	conn := db.Conn(t)
	var port, backend int
	var start int64
	var dir string
	if err := conn.QueryRow(ctx, "select current_setting('port')::int, (extract(epoch from pg_postmaster_start_time()) * 1e6)::int8, "+
		"current_setting('data_directory'), pg_backend_pid()").Scan(&port, &start, &dir, &backend); err != nil {
		t.Fatal(err)
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(backend) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	postmaster := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))[1]
	report := func(phase string) {
		line := fmt.Sprintf("pkg=%%s phase=%%s pid=%%d port=%%d start=%%d postmaster=%%s dir=%%s first=%%d",
			pkg, phase, os.Getpid(), port, start, postmaster, dir, first.Microseconds())
		if err := appendLine("reports", line); err != nil {
			t.Fatal(err)
		}
	}
	var n int // the schema came from the template
	if err := conn.QueryRow(ctx, "select count(*) from items").Scan(&n); err != nil {
		t.Fatal(err)
	}
	report("before")
	if !strings.Contains(","+os.Getenv("SHARE_HOLD")+",", ","+pkg+",") {
		return
	}
	if _, err := os.ReadFile(filepath.Join(os.Getenv("SHARE_DIR"), "hold-"+pkg)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "insert into items values (1, 'after')"); err != nil {
		t.Fatal(err)
	}
	report("after")
}
`

// shareModule writes a module of n packages, p0 … p<n-1>, in a temp dir,
// requiring this repository through a replace directive.
func shareModule(t *testing.T, n int) string {
	t.Helper()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mod := t.TempDir()
	files := map[string]string{"go.mod": shareGoMod(string(gomod), repo)}
	for i := range n {
		name := "p" + strconv.Itoa(i)
		files[filepath.Join(name, name+"_test.go")] = fmt.Sprintf(sharePkg, name)
	}
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	files["go.sum"] = string(sum)
	for name, text := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(mod, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mod, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return mod
}

// shareGoMod is the go.mod of a shareModule: the repo's own, verbatim
// but for its module line, with pglocks itself required and replaced by
// the repo. With the repo's whole requirement list (and its replace and
// exclude directives, which only a main module's go.mod applies) the go
// command loads the same pruned module graph as the repo's own build,
// whose go.mod files a fresh module cache holds; with pglocks alone it
// walked the unpruned graph of old modules (a go.mod not in the cache,
// and GOPROXY=off).
func shareGoMod(gomod, repo string) string {
	lines := strings.Split(gomod, "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "module ") {
			lines[i] = "module sharetest"
			break
		}
	}
	return strings.Join(lines, "\n") + fmt.Sprintf("\nrequire github.com/pglocks/pglocks v0.0.0\n\nreplace github.com/pglocks/pglocks => %s\n", repo)
}

// goTest is one go test run over a shareModule.
type goTest struct {
	t    *testing.T
	dir  string // the packages' reports, counts and FIFOs
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan error
}

// startGoTest runs go test over mod's packages with env added; the
// packages named by hold wait on their FIFO after their first report.
func startGoTest(t *testing.T, mod string, hold []string, args []string, env ...string) *goTest {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	g := &goTest{t: t, dir: t.TempDir(), done: make(chan error, 1)}
	for _, pkg := range hold {
		if err := syscall.Mkfifo(filepath.Join(g.dir, "hold-"+pkg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	flags := []string{"test", "-count=1"}
	if raceBuild {
		flags = append(flags, "-race") // the build cache has the suite's race builds
	}
	g.cmd = exec.Command(goCmd, append(append(flags, args...), "./...")...)
	g.cmd.Dir = mod
	g.cmd.Env = append(withoutEnv(withoutEnv(os.Environ(), "PGTEST_DSN"), "PGTEST_SHARE"),
		append([]string{"PGTEST_DOCKER=0", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local",
			"SHARE_DIR=" + g.dir, "SHARE_HOLD=" + strings.Join(hold, ",")}, env...)...)
	g.cmd.Stdout, g.cmd.Stderr = &g.out, &g.out
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { g.done <- g.cmd.Wait() }()
	t.Cleanup(func() {
		// A failed test must not leave the binaries waiting on their FIFO.
		_ = g.cmd.Process.Kill()
		for _, r := range g.readReports() {
			_ = syscall.Kill(r.pid, syscall.SIGKILL)
		}
	})
	return g
}

// wait waits for go test to exit and returns its error.
func (g *goTest) wait(ctx context.Context) error {
	select {
	case err := <-g.done:
		return err
	case <-ctx.Done():
		g.t.Fatalf("go test still runs: %v\n%s", ctx.Err(), g.out.String())
		return nil
	}
}

// shareReport is one line a package's test reported.
type shareReport struct {
	pkg, phase, dir   string
	pid, port         int
	postmaster        int
	start, firstMicro int64
}

func (g *goTest) readReports() []shareReport {
	b, _ := os.ReadFile(filepath.Join(g.dir, "reports"))
	var out []shareReport
	for sc := bufio.NewScanner(bytes.NewReader(b)); sc.Scan(); {
		f := map[string]string{}
		for _, kv := range strings.Fields(sc.Text()) {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		r := shareReport{pkg: f["pkg"], phase: f["phase"], dir: f["dir"]}
		r.pid, _ = strconv.Atoi(f["pid"])
		r.port, _ = strconv.Atoi(f["port"])
		r.postmaster, _ = strconv.Atoi(f["postmaster"])
		r.start, _ = strconv.ParseInt(f["start"], 10, 64)
		r.firstMicro, _ = strconv.ParseInt(f["first"], 10, 64)
		out = append(out, r)
	}
	return out
}

// waitReports waits until n reports of phase are in.
func (g *goTest) waitReports(ctx context.Context, phase string, n int) []shareReport {
	g.t.Helper()
	var got []shareReport
	waitFor(g.t, ctx, func() bool {
		got = got[:0]
		for _, r := range g.readReports() {
			if r.phase == phase {
				got = append(got, r)
			}
		}
		return len(got) >= n
	}, func() string {
		return fmt.Sprintf("%d of %d %q reports; go test output:\n%s", len(got), n, phase, g.out.String())
	})
	return got
}

// release lets the waiting package pkg go on.
func (g *goTest) release(ctx context.Context, pkg string) {
	g.t.Helper()
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(g.dir, "hold-"+pkg), []byte("go\n"), 0) }()
	select {
	case err := <-done:
		if err != nil {
			g.t.Fatal(err)
		}
	case <-ctx.Done():
		g.t.Fatalf("package %s never read its FIFO", pkg)
	}
}

// migrations returns how many times the packages' Migrator ran.
func (g *goTest) migrations() int {
	b, err := os.ReadFile(filepath.Join(g.dir, "migrations"))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	return strings.Count(string(b), "\n")
}

// oneServer checks that every report names the same server, and returns
// its postmaster and directory.
func oneServer(t *testing.T, reports []shareReport) (postmaster int, dir string) {
	t.Helper()
	first := reports[0]
	for _, r := range reports[1:] {
		if r.postmaster != first.postmaster || r.start != first.start || r.port != first.port {
			t.Fatalf("two servers: %s saw postmaster %d (port %d, started %d), %s saw %d (port %d, started %d)",
				first.pkg, first.postmaster, first.port, first.start, r.pkg, r.postmaster, r.port, r.start)
		}
	}
	return first.postmaster, filepath.Dir(first.dir)
}

// waitGone waits until the server's directory and postmaster are gone.
func waitServerGone(t *testing.T, ctx context.Context, postmaster int, dir string) {
	t.Helper()
	waitFor(t, ctx, func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist) && !anyAlive([]int{postmaster})
	}, func() string {
		return fmt.Sprintf("the shared server (postmaster %d, %s) is still there", postmaster, dir)
	})
}

// firstDBs logs how long each binary took to its first database.
func firstDBs(t *testing.T, reports []shareReport) {
	var b strings.Builder
	for _, r := range reports {
		fmt.Fprintf(&b, " %s %v", r.pkg, (time.Duration(r.firstMicro) * time.Microsecond).Round(time.Millisecond))
	}
	t.Logf("first database after the binary's start:%s", b.String())
}
