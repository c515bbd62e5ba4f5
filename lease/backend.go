package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks/internal/outcome"
)

// backend is the server process that ran an acquire attempt: its pid, and
// the local time the statement was sent. pid 0: nothing to wait for.
type backend struct {
	pid  uint32
	sent time.Time
}

// errBackendBusy: the backend of an attempt whose outcome is unknown is
// still there; the cleanup waits (settle retries it).
var errBackendBusy = errors.New("lease: the interrupted attempt's backend is still running")

// endBackendSQL terminates the backend b.pid, waiting up to 5 s for it to
// exit, if it is still the backend that ran the attempt: one that started
// before the attempt was sent ($2 µs ago by the local clock, measured
// before this statement was sent, so clock_timestamp() − $2 is after the
// send by the server's clock). No row: it is gone.
const endBackendSQL = `select pg_terminate_backend(pid, 5000) from pg_stat_activity
where pid = $1 and backend_start < clock_timestamp() - $2::bigint * interval '1 microsecond'`

// waitBackendSQL is endBackendSQL for roles that may not terminate the
// backend: whether it is still there.
const waitBackendSQL = `select exists (select from pg_stat_activity
where pid = $1 and backend_start < clock_timestamp() - $2::bigint * interval '1 microsecond')`

// endBackend makes sure the statement an attempt sent on a connection that
// was then closed (ctx ended, the reply was lost) can no longer commit:
// the server runs a statement it has received to its end whether or not
// the client is still there, so the attempt's backend is terminated — a
// statement still running or still unread is rolled back or never run —
// or, without the privilege to, waited for until it exits after reading
// the closed connection's end. Only then is a cleanup by the attempt's id
// sure to find any acquisition it made. It returns nil once the backend
// is gone, errBackendBusy while it is not.
func (s *Store) endBackend(ctx context.Context, b backend) error {
	ago := s.cfg.Now().Sub(b.sent).Microseconds()
	rows, err := s.pool.Query(ctx, endBackendSQL, int32(b.pid), ago)
	if err != nil {
		return err
	}
	var terminated bool
	n := 0
	for rows.Next() {
		n++
		if err := rows.Scan(&terminated); err != nil {
			rows.Close()
			return err
		}
	}
	rows.Close()
	switch err := rows.Err(); {
	case outcome.SQLState(err) == "42501": // may not signal it: wait for it to exit
		var there bool
		if err := s.pool.QueryRow(ctx, waitBackendSQL, int32(b.pid), s.cfg.Now().Sub(b.sent).Microseconds()).Scan(&there); err != nil {
			return err
		}
		if there {
			return errBackendBusy
		}
		return nil
	case err != nil:
		return err
	case n > 0 && !terminated:
		return fmt.Errorf("%w (pid %d did not exit within 5 s of its termination)", errBackendBusy, b.pid)
	}
	return nil
}
