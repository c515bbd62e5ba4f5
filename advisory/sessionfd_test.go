//go:build linux

package advisory_test

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/sessionfd"
)

// sessionfd.File gives a close-on-exec duplicate of the socket of the
// session that holds the lock, and leaves that socket non-blocking even
// once the duplicate's Fd is taken (as os/exec does to pass it on): the
// session's deadlines depend on it.
func TestSessionFile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	lk, err := b.locker.TryLock(ctx, pglocks.KeyOf("sessionfd"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := sessionfd.File(lk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Fatalf("the session's socket is blocking (flags %#x, %v) after Fd: its deadlines no longer work", fl, err)
	}
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
		t.Fatalf("the duplicate is not close-on-exec (%#x, %v)", fl, err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	in4, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		t.Skipf("the session is on a %T, not TCP: no port to compare", sa)
	}
	var port int
	if err := b.db.Conn(t).QueryRow(ctx, "select client_port from pg_stat_activity where pid = $1", int32(lk.PID())).Scan(&port); err != nil {
		t.Fatal(err)
	}
	if port != in4.Port {
		t.Fatalf("the duplicate's local port is %d, the lock session's %d", in4.Port, port)
	}
	if err := lk.Verify(ctx); err != nil {
		t.Fatalf("the session after the duplicate was made: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sessionfd.File("not a lock"); err == nil {
		t.Error("sessionfd.File of a string: no error")
	}
}
