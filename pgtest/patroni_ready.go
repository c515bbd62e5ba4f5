package pgtest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Primary returns the node whose Patroni REST API answers GET /primary
// with 200, or "" if none does now. The nodes are asked at once, and the
// first 200 answers: a paused node's API may take its whole timeout (2 s)
// to answer.
func (p *Patroni) Primary(ctx context.Context) string {
	answers := make(chan string, len(p.nodes))
	for _, n := range p.nodes {
		go func() {
			if code, _ := httpGet(ctx, "http://"+n.addr(n.restPort)+"/primary"); code == http.StatusOK {
				answers <- n.name
				return
			}
			answers <- ""
		}()
	}
	for range p.nodes {
		if name := <-answers; name != "" {
			return name
		}
	}
	return ""
}

// WaitPrimary waits until a node other than not (any node if not is "")
// accepts a write — is out of recovery, whatever Patroni's REST API says
// yet — and returns that node. On ctx's end the error carries Patroni's view of the cluster
// (patronictl list) and the logs' tails.
func (p *Patroni) WaitPrimary(ctx context.Context, not string) (string, error) {
	return p.waitPrimary(ctx, not, false)
}

// WaitSynchronous waits for a primary that Patroni's REST API names and
// that accepts a write, every other node a replica Patroni would promote
// (running, not lagging) that streams from it on its timeline and has
// received its WAL (rewound and rejoined, if it had to be) and, in
// synchronous mode, Patroni's sync key in etcd naming a synchronous
// standby that the primary's pg_stat_replication shows as one: the
// cluster is then ready for another failover.
func (p *Patroni) WaitSynchronous(ctx context.Context) (string, error) {
	return p.waitPrimary(ctx, "", true)
}

func (p *Patroni) waitPrimary(ctx context.Context, not string, sync bool) (string, error) {
	if !sync {
		if name := p.firstWritable(ctx, not); name != "" {
			return name, nil
		}
	}
	for sync && ctx.Err() == nil {
		if name := p.Primary(ctx); name != "" && name != not && p.writable(ctx, name) && p.hasSync(ctx, name) {
			return name, nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return "", fmt.Errorf("pgtest: Patroni elected no primary (other than %q; synchronous standby wanted: %v): %w\n%s",
		not, sync && !p.opts.Async, context.Cause(ctx), p.view())
}

// firstWritable polls every node but not, each on its own (a paused node
// holds a connection attempt for its timeout), and returns the first that
// accepts a write, or "" when ctx ends.
func (p *Patroni) firstWritable(ctx context.Context, not string) string {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	found := make(chan string, len(p.nodes))
	for _, n := range p.nodes {
		if n.name == not {
			continue
		}
		go func() {
			for !p.writable(ctx, n.name) {
				select {
				case <-ctx.Done():
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
			found <- n.name
		}()
	}
	select {
	case name := <-found:
		return name
	case <-ctx.Done():
		return ""
	}
}

// writable reports whether name accepts a write, connecting to it alone:
// Patroni's part of a failover ends there. The write is real — a row of
// its own table, WAL and all — so that its commit waits for a synchronous
// standby as a client's would (a transaction that only takes an xid does
// not); and a commit whose wait was cancelled (by the 5 s bound: the
// server then reports success with a warning) does not count. (A client's
// multi-host DSN may take longer: it tries the hosts in turn, and a
// paused or cut-off one holds it for connect_timeout.)
func (p *Patroni) writable(ctx context.Context, name string) bool {
	dsn, err := p.NodeDSN(name)
	if err != nil {
		return false
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return false
	}
	var unsynced atomic.Bool
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.HasPrefix(n.Message, "canceling wait for synchronous replication") {
			unsynced.Store(true)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, writeProbeSQL)
	return err == nil && ctx.Err() == nil && !unsynced.Load()
}

// writeProbeSQL is writable's write: one implicit transaction (a simple
// query) that makes its table if need be and bumps its one row.
const writeProbeSQL = `create table if not exists pgtest_patroni_writes (id int primary key, n bigint not null);
insert into pgtest_patroni_writes values (1, 1) on conflict (id) do update set n = pgtest_patroni_writes.n + 1`

// hasSync reports whether the cluster is ready for another failover
// with primary as its primary: every other node a healthy replica by
// Patroni's own measure — GET /replica?lag=1MB answers 200: running, and
// replayed to within maximum_lag_on_failover of the leader's last
// position, so Patroni would promote it — and settled by the truth (see
// settled): streaming from primary on its timeline and caught up with
// it, and, in synchronous mode, the sync key in etcd naming primary's
// synchronous standby as primary's pg_stat_replication shows it.
//
// No node's GET /sync is trusted: it answers from the node's cached copy
// of the sync key, for a standby that may not be synchronous yet (a fault
// played then left Patroni nobody to promote); and GET /replica answers
// 200 also for a replica that still has to be rewound (left on an older
// timeline, or a rejoining old primary before its pg_rewind).
func (p *Patroni) hasSync(ctx context.Context, primary string) bool {
	for _, n := range p.nodes {
		if n.name == primary {
			continue
		}
		if code, _ := httpGet(ctx, "http://"+n.addr(n.restPort)+"/replica?lag=1048576"); code != http.StatusOK {
			return false
		}
	}
	return p.settled(ctx, primary)
}
