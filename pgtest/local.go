package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// local is a throwaway cluster run from local binaries in a temp dir.
type local struct {
	bindir string
	dir    string // temp dir: data/, the socket, postgres.log
	port   int
	cred   *syscall.Credential // run as this user when we are root
	args   []string
	reaper *reaper

	// detached: the postmaster is no child of ours, none of our
	// goroutines waits for it, and it outlives this process (a shared
	// server, see share.go); pid is its process id.
	detached bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	pid  int           // detached: the postmaster's pid, 0 once stopped
}

func startLocal(ctx context.Context, cfg config) (*Server, error) {
	l, err := newLocal()
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			l.close()
		}
	}()
	if err := l.initdb(ctx); err != nil {
		return nil, err
	}
	if err := l.allowPartitionSubnet(); err != nil {
		return nil, err
	}
	l.args = l.baseArgs(cfg)
	if err := l.startOnFreePort(ctx); err != nil {
		return nil, err
	}
	s := newServer(ModeLocal, cfg, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", l.port), l)
	if err := s.init(ctx); err != nil {
		return nil, fmt.Errorf("local server: %w", err)
	}
	ok = true
	return s, nil
}

// newLocal finds the binaries (initdb, postgres and extra) and makes the temp dir, watched by a reaper,
// of a server not yet initialized.
func newLocal(extra ...string) (*local, error) {
	bindir, err := findBinDir(extra...)
	if err != nil {
		return nil, err
	}
	l := &local{bindir: bindir}
	if os.Geteuid() == 0 {
		if l.cred, err = unprivilegedUser(); err != nil {
			return nil, err
		}
	}
	if l.dir, err = os.MkdirTemp(dataParent(), "pgtest-"); err != nil {
		return nil, err
	}
	// From here on the watchdog removes the dir should this process die.
	if l.reaper, err = startReaper(l.dir, "", ""); err != nil {
		os.RemoveAll(l.dir)
		return nil, err
	}
	if l.cred != nil {
		if err := os.Chown(l.dir, int(l.cred.Uid), int(l.cred.Gid)); err != nil {
			l.close()
			return nil, err
		}
	}
	return l, nil
}

// allowPartitionSubnet lets partitionable proxies' namespaces connect (see
// partition.go); pg_hba.conf rejects every other non-loopback address.
func (l *local) allowPartitionSubnet() error {
	hba, err := os.OpenFile(filepath.Join(l.dir, "data", "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = hba.WriteString("host all all " + partitionSubnet + " trust\n")
	if cerr := hba.Close(); err == nil {
		err = cerr
	}
	return err
}

// baseArgs are the postgres arguments of every throwaway local server.
func (l *local) baseArgs(cfg config) []string {
	return append([]string{
		"-D", filepath.Join(l.dir, "data"),
		"-c", "listen_addresses=*",
		"-c", "unix_socket_directories=" + l.dir,
		"-c", "max_connections=" + strconv.Itoa(cfg.maxConns),
		"-c", "max_locks_per_transaction=128",
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "shared_buffers=64MB",
		"-c", "log_min_messages=warning",
	}, cfg.settingArgs()...)
}

// startOnFreePort starts postgres on a free port. A free port can be taken
// between our probe and postgres' bind; it retries then.
func (l *local) startOnFreePort(ctx context.Context) error {
	var err error
	for attempt := 0; ; attempt++ {
		if l.port, err = freePort(); err != nil {
			return err
		}
		err = l.start(ctx)
		if err == nil || attempt == 4 || !strings.Contains(err.Error(), "could not bind") {
			return err
		}
	}
}

// findBinDir finds a directory holding initdb, postgres and the extra
// programs named: PGTEST_BINDIR alone when set, else PATH (as found, then
// with symbolic links resolved), then `pg_config --bindir`, then the newest
// /usr/lib/postgresql/*/bin.
func findBinDir(extra ...string) (string, error) {
	names := append([]string{"initdb", "postgres"}, extra...)
	if dir := os.Getenv("PGTEST_BINDIR"); dir != "" {
		if hasAll(dir, names) {
			return dir, nil
		}
		return "", fmt.Errorf("PGTEST_BINDIR=%s lacks one of %s", dir, strings.Join(names, ", "))
	}
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
		if r, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(r))
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	versioned, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(versioned, func(i, j int) bool { return pgMajor(versioned[i]) > pgMajor(versioned[j]) })
	dirs = append(dirs, versioned...)
	for _, d := range dirs {
		if hasAll(d, names) {
			return d, nil
		}
	}
	return "", fmt.Errorf("no directory with %s found on PATH, in `pg_config --bindir` or /usr/lib/postgresql/*/bin",
		strings.Join(names, ", "))
}

func hasAll(dir string, names []string) bool {
	for _, n := range names {
		if !isExecutable(filepath.Join(dir, n)) {
			return false
		}
	}
	return true
}

func pgMajor(bindir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bindir)))
	return n
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// unprivilegedUser is who runs initdb and postgres when we are root, since
// both refuse to run as root: the postgres user, else nobody.
func unprivilegedUser() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root, and initdb refuses root: no postgres or nobody user to run it as")
}

func (l *local) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(l.bindir, name), args...)
	// Its own process group: a terminal's SIGINT goes to the test binary,
	// which cleans up, not straight to postgres.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: l.cred}
	cmd.Dir = l.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

// start runs postgres on l.port and waits until it accepts connections.
func (l *local) start(ctx context.Context) error {
	logPath := filepath.Join(l.dir, "postgres.log")
	launch := l.launch
	if l.detached {
		launch = l.launchDetached
	}
	exited, err := launch(logPath)
	if err != nil {
		return err
	}
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", l.port)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		if exited() {
			return fmt.Errorf("%w: %s", errExitedAtStart, tail(logPath))
		}
		select {
		case <-ctx.Done():
			l.stop(syscall.SIGQUIT)
			return fmt.Errorf("postgres not ready: %w: %s", context.Cause(ctx), tail(logPath))
		case <-time.After(delay):
		}
	}
}

// launch starts postgres as a child of this process, and returns a
// function that reports whether it has exited.
func (l *local) launch(logPath string) (func() bool, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	// Not CommandContext: the server outlives ctx, which bounds only the start.
	cmd := l.command(context.Background(), "postgres", append(l.args, "-p", strconv.Itoa(l.port))...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	l.mu.Lock()
	l.cmd, l.done = cmd, done
	l.mu.Unlock()
	return func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}, nil
}

// detachScript starts the postmaster ($0, arguments $@) in the background
// of a shell that exits at once, and prints its pid: the postmaster's
// parent is then init, not this process, and its output goes to the log,
// not to a pipe of ours (go test waits for its test binaries' pipes to
// close).
const detachScript = `"$0" "$@" </dev/null >>"$PGTEST_LOG" 2>&1 &
echo $!`

// launchDetached starts postgres outside this process's care, for a
// server that outlives it, and returns a function that reports whether it
// has exited.
func (l *local) launchDetached(logPath string) (func() bool, error) {
	cmd := l.command(context.Background(), "postgres", append(l.args, "-p", strconv.Itoa(l.port))...)
	cmd.Args = append([]string{"sh", "-c", detachScript, cmd.Path}, cmd.Args[1:]...)
	cmd.Path, cmd.Err = "/bin/sh", nil
	cmd.Env = append(cmd.Env, "PGTEST_LOG="+logPath)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return nil, fmt.Errorf("postgres: started, but its pid is %q", out)
	}
	l.mu.Lock()
	l.pid = pid
	l.mu.Unlock()
	return func() bool { return !processAlive(pid) }, nil
}

// stop signals the postmaster (SIGINT: fast shutdown, SIGQUIT: immediate)
// and waits for it to exit.
func (l *local) stop(sig syscall.Signal) {
	l.mu.Lock()
	cmd, done, pid := l.cmd, l.done, l.pid
	l.cmd, l.pid = nil, 0
	l.mu.Unlock()
	if pid != 0 {
		stopDetached(pid, sig)
		return
	}
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// stopDetached signals the detached process pid and waits for it to exit;
// after 30 s it kills it.
func stopDetached(pid int, sig syscall.Signal) {
	if syscall.Kill(pid, sig) == nil && !waitDead(pid, 30*time.Second) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitDead(pid, time.Minute)
	}
}

// errExitedAtStart is the error of a postmaster that exited before it
// accepted a connection.
var errExitedAtStart = errors.New("postgres exited at start")

// restart stops the server (fast shutdown) and starts it again. The new
// postmaster can exit at once while processes of the old one are still
// going away (after a crash, a backend may outlive its postmaster by a
// moment, holding the old shared memory): it is started again until ctx
// ends.
func (l *local) restart(ctx context.Context) error {
	l.stop(syscall.SIGINT)
	for {
		err := l.start(ctx)
		if err == nil || !errors.Is(err, errExitedAtStart) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (l *local) close() error {
	l.stop(syscall.SIGQUIT)
	err := os.RemoveAll(l.dir)
	l.reaper.dismiss()
	return err
}

func (l *local) describe() string {
	return fmt.Sprintf("127.0.0.1:%d (%s, data in %s)", l.port, l.bindir, l.dir)
}

// freePort returns a TCP port that no one listens on, on any address (the
// servers and poolers pgtest starts listen beyond loopback), at the time
// of the call: another listener may take it before the caller binds it.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the end of the server log, for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}
