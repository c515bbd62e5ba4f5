package leader_test

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/lease"
	"golang.org/x/sys/unix"
)

// patroniReplica is a candidate's pool, Locker and Store on the cluster.
// With PGLOCKS_PATRONI_BOUNDED=1 its pool's connections bound themselves
// as the advisory sessions do — keepalives every second, and
// TCP_USER_TIMEOUT 10 s — so that a statement sent to a primary that was
// cut off fails instead of waiting for the kernel's retransmissions.
func patroniReplica(t *testing.T, dsn string) replica {
	t.Helper()
	if os.Getenv("PGLOCKS_PATRONI_BOUNDED") != "1" {
		return newReplica(t, dsn)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 3},
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 10000)
			})
			return errors.Join(err, serr)
		},
	}
	cfg.ConnConfig.DialFunc = d.DialContext
	pool, err := pgxpool.NewWithConfig(ctxT(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	locker, err := advisory.New(pool, advisory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = store.Close(ctx)
		_ = locker.Close(ctx)
		pool.Close()
	})
	return replica{pool, locker, store}
}
