package advisory

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pglocks/pglocks/internal/sessionfd"
)

func init() { sessionfd.File = sessionFile }

// sessionFile is [sessionfd.File]: a duplicate of the socket of the
// session that holds lock, an open *Lock.
func sessionFile(lock any) (*os.File, error) {
	var lk *Lock
	switch v := lock.(type) {
	case *Lock:
		lk = v
	case *Locks:
		if v.unusable() == nil && len(v.locks) > 0 {
			lk = v.locks[0] // all on one session
		}
	case *Permits:
		if v.unusable() == nil && len(v.locks.locks) > 0 {
			lk = v.locks.locks[0]
		}
	default:
		return nil, fmt.Errorf("advisory: session socket of a %T, not a *Lock, *Locks or *Permits", lock)
	}
	if err := lk.unusable(); err != nil {
		return nil, fmt.Errorf("advisory: session socket: %w", err)
	}
	if err := lk.Err(); err != nil {
		return nil, fmt.Errorf("advisory: session socket: %w", err)
	}
	f, err := dupSocket(lk.sess.conn.Conn())
	if err != nil {
		return nil, opErr("session socket", lk.key, err)
	}
	return f, nil
}

// dupSocket duplicates the socket under c (under TLS too), close-on-exec.
//
// Not net.TCPConn.File: the *os.File it returns puts the socket in
// blocking mode when its Fd is taken (os/exec does, to pass it on), and
// that mode belongs to the socket, shared with the session's own
// descriptor, whose deadlines would stop working. A file made by
// os.NewFile from a non-blocking descriptor leaves the mode alone.
func dupSocket(c net.Conn) (*os.File, error) {
	for {
		u, ok := c.(interface{ NetConn() net.Conn }) // *tls.Conn
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("the connection is a %T, not a socket", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, derr := -1, error(nil)
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("dup: %w", derr)
	}
	f := os.NewFile(uintptr(fd), "advisory lock session")
	if f == nil {
		return nil, errors.New("dup: bad descriptor")
	}
	return f, nil
}
