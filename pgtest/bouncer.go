package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// PoolMode is the pooling mode of a [Bouncer].
type PoolMode string

const (
	// PoolSession gives each client connection its own server session for
	// as long as it stays connected (PgBouncer's pool_mode = session).
	PoolSession PoolMode = "session"
	// PoolTransaction lends a server session to a client connection for
	// one transaction only; consecutive statements of one client may run on
	// different server sessions (pool_mode = transaction).
	PoolTransaction PoolMode = "transaction"
	// PoolStatement lends a server session to a client for one statement
	// only and refuses transactions of several statements (pool_mode =
	// statement): a client's BEGIN ends its connection.
	PoolStatement PoolMode = "statement"
)

// BouncerOption changes one setting of a [Bouncer] from pgtest's default.
type BouncerOption func(*bouncerSettings)

type bouncerSettings struct {
	poolSize   int
	roundRobin bool
}

// BouncerPoolSize sets how many server sessions the bouncer opens per
// database and user (default_pool_size). Default: 200. Values below 1
// count as 1.
func BouncerPoolSize(n int) BouncerOption {
	return func(s *bouncerSettings) { s.poolSize = max(n, 1) }
}

// BouncerRoundRobin makes the bouncer hand out its idle server sessions in
// turn, the least recently used first (server_round_robin = 1), instead of
// the most recently used first (PgBouncer's default): the reuse order of a
// bouncer in front of a load balancer.
func BouncerRoundRobin() BouncerOption {
	return func(s *bouncerSettings) { s.roundRobin = true }
}

// ErrNoBouncer is returned by [StartBouncer] when no pgbouncer binary is
// found (PGTEST_PGBOUNCER, PATH, /usr/sbin/pgbouncer).
var ErrNoBouncer = errors.New("pgtest: no pgbouncer binary (install Debian's pgbouncer package, or set PGTEST_PGBOUNCER)")

// Bouncer is a real PgBouncer that pgtest started in front of a [Server].
// Every database of the server is reachable through it under its own name
// (a "*" fallback entry), as the user the client names. It listens on a
// free port — on loopback, and, where partition links can be made (Linux,
// as root: see [Partitionable]), on every address but for clients from
// loopback and the links' range only — and keeps its files in a temp dir,
// both removed by [Bouncer.Close]; should the process die first, a
// watchdog kills it.
type Bouncer struct {
	mode   PoolMode
	set    bouncerSettings
	dir    string
	port   int
	reaper *reaper
	cmd    *exec.Cmd
	done   chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// StartBouncer starts pgbouncer in mode in front of s, which must be
// reached over TCP, with opts changing its defaults, and returns once it
// accepts connections. ctx bounds only the start.
func StartBouncer(ctx context.Context, s *Server, mode PoolMode, opts ...BouncerOption) (*Bouncer, error) {
	if mode != PoolSession && mode != PoolTransaction && mode != PoolStatement {
		return nil, fmt.Errorf("pgtest: pool mode %q: want %q, %q or %q", mode, PoolSession, PoolTransaction, PoolStatement)
	}
	bin, err := bouncerBinary()
	if err != nil {
		return nil, err
	}
	target, err := pgconn.ParseConfig(s.adminDSN)
	if err != nil {
		return nil, err
	}
	if strings.HasPrefix(target.Host, "/") {
		return nil, errNoTCP
	}
	b := &Bouncer{mode: mode, set: bouncerSettings{poolSize: 200}}
	for _, o := range opts {
		o(&b.set)
	}
	if b.dir, err = os.MkdirTemp("", "pgtest-pgbouncer-"); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = b.Close()
		}
	}()
	var cred *syscall.Credential
	if os.Geteuid() == 0 { // pgbouncer refuses to run as root
		if cred, err = unprivilegedUser(); err != nil {
			return nil, err
		}
		if err := os.Chown(b.dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	// A free port can be taken between our probe and pgbouncer's bind; retry.
	for attempt := 0; ; attempt++ {
		if b.port, err = pickPort(s); err != nil {
			return nil, err
		}
		if err = b.writeConfig(target); err != nil {
			return nil, err
		}
		if err = b.start(ctx, bin, cred, s.adminDSN); err == nil || attempt == 4 || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	ok = true
	return b, nil
}

// bouncerBinary finds pgbouncer: PGTEST_PGBOUNCER, PATH, /usr/sbin.
func bouncerBinary() (string, error) {
	return findBinary("PGTEST_PGBOUNCER", "pgbouncer", "/usr/sbin/pgbouncer", ErrNoBouncer)
}

// writeConfig writes pgbouncer.ini, its hba file and the user list.
// Clients are trusted (the server decides who may log in: its own
// pg_hba.conf); a server reached with a password (PGTEST_DSN) is logged
// into as that user. Where partition links can be made (linksUsable), the
// bouncer listens beyond loopback for the links' range only (its hba file
// rejects every other address), so that a [Partitionable] proxy in front
// of it cuts PgBouncer's own client connections; elsewhere it listens on
// loopback only.
func (b *Bouncer) writeConfig(target *pgconn.Config) error {
	listen, hba := "127.0.0.1", "host all all 127.0.0.1/32 trust\n"
	if linksUsable() {
		listen, hba = "0.0.0.0", hba+"host all all "+partitionSubnet+" trust\n"
	}
	db := fmt.Sprintf("host=%s port=%d", target.Host, target.Port)
	if target.Password != "" {
		db += fmt.Sprintf(" user=%s password=%s", connQuote(target.User), connQuote(target.Password))
	}
	ini := strings.Join([]string{
		"[databases]",
		"* = " + db,
		"[pgbouncer]",
		"listen_addr = " + listen,
		"listen_port = " + strconv.Itoa(b.port),
		"unix_socket_dir =",
		"auth_type = hba",
		"auth_hba_file = " + filepath.Join(b.dir, "hba.conf"),
		"auth_file = " + filepath.Join(b.dir, "userlist.txt"),
		"pool_mode = " + string(b.mode),
		"max_client_conn = 2000",
		"default_pool_size = " + strconv.Itoa(b.set.poolSize),
		"server_round_robin = " + strconv.Itoa(b2i(b.set.roundRobin)),
		"ignore_startup_parameters = extra_float_digits",
		"logfile = " + b.logfile(),
		"admin_users = " + target.User,
		"log_connections = 0",
		"log_disconnections = 0",
		"",
	}, "\n")
	if err := os.WriteFile(filepath.Join(b.dir, "hba.conf"), []byte(hba), 0o644); err != nil {
		return err
	}
	users := fmt.Sprintf("%s \"\"\n", iniQuote(target.User))
	if err := os.WriteFile(filepath.Join(b.dir, "userlist.txt"), []byte(users), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.dir, "pgbouncer.ini"), []byte(ini), 0o644)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// iniQuote quotes a value for pgbouncer's user list.
func iniQuote(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// connQuote quotes a value of a connection string in pgbouncer's
// [databases] section, which takes single quotes, doubled within.
func connQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// start runs pgbouncer and waits until a query through it succeeds.
func (b *Bouncer) start(ctx context.Context, bin string, cred *syscall.Credential, adminDSN string) error {
	cmd := exec.Command(bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	cmd.Dir = b.dir
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	b.cmd, b.done = cmd, done
	r, err := startBouncerReaper(b.dir, cmd.Process.Pid)
	if err != nil {
		b.stop()
		return err
	}
	b.reaper = r
	dsn, err := b.DSN(adminDSN)
	if err != nil {
		return err
	}
	return waitPooler(ctx, "pgbouncer", dsn, b.logfile(), done, b.stop, b.ours(dsn))
}

// logfile is where pgbouncer logs, in b's own dir.
func (b *Bouncer) logfile() string { return filepath.Join(b.dir, "pgbouncer.log") }

// ours tells whether the PgBouncer that answers at b's port is b's own: its
// admin console names b's log file.
func (b *Bouncer) ours(dsn string) func(context.Context) error {
	logfile := b.logfile()
	return func(ctx context.Context) error {
		rows, err := askPooler(ctx, dsn, "pgbouncer", "show config")
		if err != nil {
			return err
		}
		for _, r := range rows {
			if len(r) > 1 && r[0] == "logfile" && r[1] == logfile {
				return nil
			}
		}
		return fmt.Errorf("%w: the PgBouncer there logs elsewhere", errNotOurs)
	}
}

// stop ends pgbouncer at once (SIGTERM: immediate shutdown, which closes
// every client and server connection) and dismisses its watchdog.
func (b *Bouncer) stop() {
	if b.cmd != nil {
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.done:
		case <-time.After(10 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.done
		}
		b.cmd = nil
	}
	if b.reaper != nil {
		b.reaper.dismiss()
		b.reaper = nil
	}
}

// Mode returns the bouncer's pooling mode.
func (b *Bouncer) Mode() PoolMode { return b.mode }

// Addr returns the address the bouncer listens on, host:port.
func (b *Bouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// DSN returns dsn, a connection string for the bouncer's server, changed to
// connect through the bouncer.
func (b *Bouncer) DSN(dsn string) (string, error) { return viaAddr(dsn, b.Addr()) }

// Close stops pgbouncer, which closes its connections to the server, and
// removes its files. It is idempotent.
func (b *Bouncer) Close() error {
	b.closeOnce.Do(func() {
		b.stop()
		if b.dir != "" {
			b.closeErr = os.RemoveAll(b.dir)
		}
	})
	return b.closeErr
}

// bouncerReaperScript kills pgbouncer and removes its dir should this
// process die without [Bouncer.Close] (see reaperScript).
const bouncerReaperScript = `
read -r line
[ "$line" = done ] && exit 0
kill -KILL "$PGTEST_REAP_PID" 2>/dev/null
rm -rf "$PGTEST_REAP_DIR"
exit 0
`

func startBouncerReaper(dir string, pid int) (*reaper, error) {
	return startWatchdog(bouncerReaperScript, "PGTEST_REAP_DIR="+dir, "PGTEST_REAP_PID="+strconv.Itoa(pid))
}
