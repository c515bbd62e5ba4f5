package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Cluster is a throwaway primary with one streaming standby, both run from
// local PostgreSQL binaries (Docker is not used). Its embedded [Server]
// connects through a multi-host DSN with target_session_attrs=read-write,
// so [Server.DSN], [Server.NewDB] and every pool opened on their DSNs reach
// whichever node is the primary, before and after [Cluster.Promote].
//
// The standby is made with pg_basebackup, streams with standby.signal and
// primary_conninfo, and is synchronous (the primary's
// synchronous_standby_names = '*', every commit waits for the standby's
// flush) with [WithSynchronousStandby], else asynchronous. [Server.Restart]
// restarts the primary (the standby reconnects). Close removes both nodes;
// should the process die first, each node's watchdog removes it (see the
// package doc).
type Cluster struct {
	*Server

	mu      sync.Mutex
	primary *local
	standby *local   // nil after Promote until Rejoin
	retired []*local // stopped former primaries
	sync    bool
}

// WithSynchronousStandby makes a [Cluster]'s standby synchronous. Other
// servers ignore it.
func WithSynchronousStandby() Option { return func(c *config) { c.syncStandby = true } }

// StartCluster starts a primary and a standby from local binaries and
// returns once the standby streams (and, when synchronous, is the sync
// standby). ctx bounds only the start. Call [Server.Close] when done.
func StartCluster(ctx context.Context, opts ...Option) (*Cluster, error) {
	cfg := newConfig(opts)
	c := &Cluster{sync: cfg.syncStandby}
	ok := false
	defer func() {
		if !ok {
			_ = c.close()
		}
	}()
	primary, err := newLocal(clusterTools...)
	if err != nil {
		return nil, fmt.Errorf("pgtest: cluster: %w", err)
	}
	c.primary = primary
	if err := primary.initdb(ctx); err != nil {
		return nil, fmt.Errorf("pgtest: cluster: %w", err)
	}
	primary.args = clusterArgs(primary, cfg)
	if err := primary.startOnFreePort(ctx); err != nil {
		return nil, fmt.Errorf("pgtest: cluster primary: %w", err)
	}
	if c.standby, err = newStandby(ctx, primary, cfg, 0); err != nil {
		return nil, fmt.Errorf("pgtest: cluster standby: %w", err)
	}
	if err := c.attach(ctx); err != nil {
		return nil, fmt.Errorf("pgtest: cluster: %w", err)
	}
	c.Server = newServer(ModeLocal, cfg, c.multiHostDSN(), c)
	if err := c.Server.init(ctx); err != nil {
		return nil, fmt.Errorf("pgtest: cluster: %w", err)
	}
	ok = true
	return c, nil
}

// NewCluster is [StartCluster] for one test: the cluster is removed when
// the test ends. Like [NewServer] it skips the test in -short mode and
// when PGTEST_DSN is set; it also skips when the local binaries a cluster
// needs are missing, unless the CI environment variable is set, where it
// fails instead.
func NewCluster(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("pgtest: -short: skipping a test that starts its own cluster")
	}
	if newConfig(opts).dsn != "" {
		t.Skip("pgtest: PGTEST_DSN is set: a test needing its own cluster is skipped")
	}
	if err := clusterBinaries(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("pgtest: " + err.Error())
		}
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// clusterTools are the programs a cluster needs besides initdb and postgres.
var clusterTools = []string{"pg_basebackup", "pg_ctl"}

func clusterBinaries() error {
	if _, err := findBinDir(clusterTools...); err != nil {
		return fmt.Errorf("a cluster needs local binaries: %w", err)
	}
	return nil
}

// clusterArgs are a node's postgres arguments: those of every local server,
// with full-page writes on (a base backup and crash recovery need them) and
// hot standby feedback.
func clusterArgs(l *local, cfg config) []string {
	args := l.baseArgs(cfg)
	for i, a := range args {
		if a == "full_page_writes=off" {
			args[i] = "full_page_writes=on"
		}
	}
	return append(args, "-c", "hot_standby_feedback=on", "-c", "wal_sender_timeout=5s",
		"-c", "wal_receiver_status_interval=1s")
}

// Sync reports whether the standby is synchronous.
func (c *Cluster) Sync() bool { return c.sync }

// multiHostDSN lists the primary first, then the standby; pgx tries them in
// order and keeps the first that accepts writes.
func (c *Cluster) multiHostDSN() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ports := []string{strconv.Itoa(c.primary.port)}
	if c.standby != nil {
		ports = append(ports, strconv.Itoa(c.standby.port))
	}
	hosts := strings.TrimSuffix(strings.Repeat("127.0.0.1,", len(ports)), ",")
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable "+
		"target_session_attrs=read-write connect_timeout=5", hosts, strings.Join(ports, ","))
}

// PrimaryDSN connects to database dbname on the current primary alone.
func (c *Cluster) PrimaryDSN(dbname string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return nodeDSN(c.primary, dbname)
}

// StandbyDSN connects to database dbname on the standby alone (read-only),
// or returns "" after [Cluster.Promote] until [Cluster.Rejoin].
func (c *Cluster) StandbyDSN(dbname string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.standby == nil {
		return ""
	}
	return nodeDSN(c.standby, dbname)
}

func nodeDSN(l *local, dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", l.port, dbname)
}

// Promote fails the primary over to the standby: an immediate stop of the
// primary (SIGQUIT, as a crash: nothing is flushed or sent after it), then
// pg_ctl promote on the standby; it returns once the new primary accepts
// writes, with the time from the stop to that moment. The multi-host DSN
// then reaches the new primary. The cluster has no standby until
// [Cluster.Rejoin]. ctx bounds the promotion.
func (c *Cluster) Promote(ctx context.Context) (time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.standby == nil {
		return 0, errors.New("pgtest: promote: the cluster has no standby (promoted already; Rejoin first)")
	}
	start := time.Now()
	c.primary.stop(syscall.SIGQUIT)
	if err := c.standby.promote(ctx); err != nil {
		return 0, fmt.Errorf("pgtest: promote: %w", err)
	}
	old := c.primary
	c.primary, c.standby = c.standby, nil
	// The old primary's files stay until Rejoin or Close.
	c.retired = append(c.retired, old)
	c.Server.resetAdmin() // its sessions were on the old primary
	return time.Since(start), nil
}

// CreateDatabase is [Server.CreateDatabase] that also waits until the
// standby has replayed the new database ([Cluster.CatchUp]): until then a
// connection that the multi-host DSN sends to the standby — during a
// failover, say — fails with 3D000, database does not exist.
func (c *Cluster) CreateDatabase(ctx context.Context) (*Database, error) {
	d, err := c.Server.CreateDatabase(ctx)
	if err != nil {
		return nil, err
	}
	if c.StandbyDSN("postgres") == "" {
		return d, nil
	}
	if err := c.CatchUp(ctx); err != nil {
		_ = d.Drop(ctx)
		return nil, err
	}
	return d, nil
}

// NewDB is [Server.NewDB] that also waits until the standby has replayed
// the new database, as [Cluster.CreateDatabase] does.
func (c *Cluster) NewDB(t testing.TB) *DB {
	t.Helper()
	db := c.Server.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if c.StandbyDSN("postgres") != "" {
		if err := c.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return db
}
