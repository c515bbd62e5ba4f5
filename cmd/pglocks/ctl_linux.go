package main

import (
	"encoding/binary"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// The control socket joins pglocks and its supervisor (see supervised): a
// stream socket pair, fd 3 in the supervisor. pglocks sends instructions,
// ctlSize bytes each: an op and a little-endian int64 argument. Its end
// closes however pglocks ends (SIGKILL, crash, OOM killer): the
// supervisor's read then returns EOF.
const ctlSize = 9

// Instructions, pglocks to supervisor.
const (
	ctlStop     = 'S' // the lock is lost: stop the whole job
	ctlSignal   = 'F' // forward signal arg to CMD's process group
	ctlContinue = 'C' // pglocks was continued (SIGCONT): so is CMD, if stopped
	ctlTrust    = 'T' // pglocks trusts its lock until arg, on monoNow's clock
)

// reportExpired, supervisor to pglocks (one byte): the trust deadline
// passed before pglocks extended it, and the job is being stopped as on a
// loss (the dead-man's switch).
const reportExpired = 'E'

// ctlMsg is one instruction.
type ctlMsg struct {
	op  byte
	arg int64
}

func (m ctlMsg) encode() []byte {
	b := make([]byte, ctlSize)
	b[0] = m.op
	binary.LittleEndian.PutUint64(b[1:], uint64(m.arg))
	return b
}

// readControl reads pglocks' instructions; the channel is closed when
// pglocks is gone (EOF, or any error).
func readControl(f *os.File) <-chan ctlMsg {
	ch := make(chan ctlMsg, 8)
	go func() {
		defer close(ch)
		b := make([]byte, ctlSize)
		for {
			if _, err := io.ReadFull(f, b); err != nil {
				return // os.File retries EINTR itself
			}
			ch <- ctlMsg{op: b[0], arg: int64(binary.LittleEndian.Uint64(b[1:]))}
		}
	}()
	return ch
}

// monoNow reads CLOCK_MONOTONIC, the same in every process of the system,
// unlike the monotonic readings in a time.Time, which only compare within
// one process.
func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// monoOf converts a local time (with its monotonic reading) to monoNow's
// clock.
func monoOf(t time.Time) int64 { return monoNow() + int64(time.Until(t)) }

// socketPair returns the two ends of a new control socket, non-blocking
// (os.File polls them) and close-on-exec (exec.Cmd's ExtraFiles passes
// one on explicitly).
func socketPair() (ours, theirs *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "pglocks control"), os.NewFile(uintptr(fds[1]), "pglocks control"), nil
}
