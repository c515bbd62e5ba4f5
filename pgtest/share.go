package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// One local server for the package binaries of one go test.
//
// go test runs each package's test binary as a child of the go command.
// The binaries of one go command whose servers would be alike (same
// binaries, settings and user) share one local server, in a directory
// named by the go command's pid and start time and by those options:
// <temp dir>/pgtest-shared-<key>, beside the private servers' pgtest-*
// dirs. It holds:
//
//   - reaper: flock'ed exclusively by the directory's watchdog for its
//     whole life. A binary makes the directory and starts the watchdog,
//     which takes that lock, before it puts more there; a binary
//     that finds no watchdog holding it starts one (see sharedReaperScript).
//   - lock: flock'ed exclusively by whoever finds or starts the server,
//     and by the watchdog to remove it: one at a time.
//   - users: flock'ed shared by every binary that uses the server, from
//     the moment it finds it until [Server.Close] or its death (the
//     kernel drops a dead process's locks, SIGKILL or not).
//   - port: the server's port, written once it accepts connections.
//   - go: the go command's pid, start time and pid namespace, written
//     by the binary that makes the directory (mode 0700; share_dir.go says
//     which directories are accepted), first.
//   - data/, the socket, postgres.log: the cluster, as a private one's.
//
// The watchdog removes the server (an immediate shutdown, then the
// directory) once the go command is gone (no process of that pid and
// start time) and it can take users exclusively: no binary uses it.
// Between the go command's binaries the server waits, idle, for the next.
// A killed watchdog is replaced by a binary's close, and a server left
// with neither watchdog, go command nor binary is removed by the next
// binary that would share (sweepShared).
//
// A binary using it treats it as a PGTEST_DSN server: its databases
// carry its run id, it holds its run lock, and it sweeps dead runs'
// databases (sweep.go); Migrator templates are shared by hash, WithTemplate
// templates are the binary's own. Restart and RequirePasswords, which
// would hit every binary, return ErrUnsupported.

// errNoShare wraps why a binary's server is not shared; a private one
// is started then, without a warning ([SharedServer] logs why).
var errNoShare = errors.New("not shared")

// shareSpot is where the shared server of a go command and a config lives.
type shareSpot struct {
	dir    string
	parent procID // the go command
	ns     string // its pid namespace (pidNamespace)

	lockWait time.Duration // the wait for the directory's lock; 0: shareLockWait
}

// procID names a process for as long as it lives: a pid alone may be
// reused.
type procID struct {
	pid   int
	start string // its start time, in clock ticks since boot
}

// shareSpotFor returns where this process's shared server of cfg, with
// the binaries of bindir, lives; or an error wrapping errNoShare when
// this process does not share.
func shareSpotFor(cfg config, bindir string) (shareSpot, error) {
	switch {
	case os.Getenv("PGTEST_SHARE") == "0":
		return shareSpot{}, fmt.Errorf("%w: PGTEST_SHARE=0", errNoShare)
	case cfg.private:
		return shareSpot{}, fmt.Errorf("%w: WithPrivateServer", errNoShare)
	}
	parent, err := goParent()
	if err != nil {
		return shareSpot{}, err
	}
	ns := pidNamespace()
	return shareSpot{
		dir:    filepath.Join(dataParent(), "pgtest-shared-"+shareKey(parent, ns, bindir, os.Geteuid(), cfg)),
		parent: parent,
		ns:     ns,
	}, nil
}

// shareKey names the shared server of the go command parent, in the pid
// namespace ns, for the binaries of bindir, user euid and cfg.
func shareKey(parent procID, ns, bindir string, euid int, cfg config) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d\x00%s\x00%s\x00%s\x00%d\x00%d\x00%s", parent.pid, parent.start, ns, bindir, euid,
		cfg.maxConns, strings.Join(cfg.settings, "\x00"))
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// goParent returns this process's parent if it is the go command.
func goParent() (procID, error) {
	ppid := os.Getppid()
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(ppid) + "/comm")
	if err != nil {
		return procID{}, fmt.Errorf("%w: %v", errNoShare, err)
	}
	if name := strings.TrimSpace(string(comm)); name != "go" {
		return procID{}, fmt.Errorf("%w: the parent process is %s, not the go command", errNoShare, name)
	}
	st, ok := procStat(ppid)
	if !ok {
		return procID{}, fmt.Errorf("%w: cannot read /proc/%d/stat", errNoShare, ppid)
	}
	return procID{pid: ppid, start: strconv.FormatUint(st.start, 10)}, nil
}

// processAlive reports whether pid runs: it exists and is no zombie.
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	st, ok := procStat(pid)
	return !ok || (st.state != 'Z' && st.state != 'X')
}

// sharedBackend is a binary's hold on a shared server.
type sharedBackend struct {
	l       *local
	spot    shareSpot
	users   *os.File // flock'ed shared while this binary uses the server
	started bool     // this binary started it
}

func (b *sharedBackend) restart(context.Context) error {
	return fmt.Errorf("restart a server shared by the package binaries of go test: %w", ErrUnsupported)
}

// close lets the server go: the watchdog removes it once no binary uses it
// and the go command is gone. A watchdog that was killed meanwhile is
// started anew first, lest the server outlive the go command.
func (b *sharedBackend) close() error {
	if !b.spot.reaperAlive() {
		if err := b.spot.ensureReaper(); err != nil {
			logf("pgtest: the shared server %s lost its watchdog, and starting another failed: %v "+
				"(a later go test's binaries remove it)", b.spot.dir, err)
		}
	}
	return b.users.Close()
}

func (b *sharedBackend) describe() string {
	return fmt.Sprintf("127.0.0.1:%d (%s, data in %s; shared by the test binaries of go command pid %d)",
		b.l.port, b.l.bindir, b.l.dir, b.spot.parent.pid)
}

// joined says how this binary came to the server, for its log line.
func (b *sharedBackend) joined() string {
	verb := "joined the local server that an earlier test binary of this go test (pid %d) started"
	if b.started {
		verb = "started a local server for the test binaries of this go test (pid %d) to share"
	}
	return fmt.Sprintf(verb+"; it is removed once that go command has exited and no test binary uses it "+
		"(PGTEST_SHARE=0: a server per binary)", b.spot.parent.pid)
}

// startShared finds this process's shared server of cfg, or starts it, and
// returns it as this binary's run on it; an error wrapping errNoShare says
// that this process does not share.
func startShared(ctx context.Context, cfg config) (*Server, error) {
	bindir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	spot, err := shareSpotFor(cfg, bindir)
	if err != nil {
		return nil, err
	}
	sweepShared(spot.ns)
	b, err := spot.claim(ctx, cfg, bindir)
	if err != nil {
		return nil, fmt.Errorf("shared local server in %s: %w", spot.dir, err)
	}
	s := newServer(ModeLocal, cfg, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", b.l.port), b)
	s.shared = true
	if err := s.init(ctx); err != nil {
		_ = b.close()
		return nil, fmt.Errorf("shared local server %s: %w", b.describe(), err)
	}
	return s, nil
}

// WithPrivateServer, given to [Main] or [WrapMain], gives the test binary a
// local server of its own instead of the one the test binaries of a go test
// share (see [SharedServer]), as PGTEST_SHARE=0 does for every binary:
// for a package whose tests act on the whole server (ALTER SYSTEM, roles
// they count, server-wide scans they cannot scope) and cannot use
// [NewServer].
func WithPrivateServer() Option { return func(c *config) { c.private = true } }
