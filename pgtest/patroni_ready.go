package pgtest

import (
	"context"
	"fmt"
	"net/http"
	"slices"
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
// (running, not lagging) and, in synchronous mode, one of them Patroni's
// synchronous standby: the cluster is then ready for another failover.
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

// hasSync reports whether every node but the primary is a healthy
// replica — Patroni's GET /replica?lag=1MB answers 200: running, and
// replayed to within maximum_lag_on_failover of the leader's last
// position, so Patroni would promote it — and, in synchronous mode,
// whether one of them is Patroni's synchronous standby (GET /sync): only
// then will Patroni switch over or fail over without losing commits.
// (GET /sync alone is not enough: it answers from the DCS's sync key, for
// a standby that may not stream yet, and Patroni refuses to promote a
// replica that lags.)
//
// And every one of them must stream from the primary (its
// pg_stat_replication): GET /replica answers 200 also for a replica left
// on an older timeline that streams from nowhere (seen with three nodes
// after a failover: it needed pg_rewind), which the next failover in
// strict mode would find no synchronous standby in.
func (p *Patroni) hasSync(ctx context.Context, primary string) bool {
	sync := p.opts.Async
	for _, n := range p.nodes {
		if n.name == primary {
			continue
		}
		rest := "http://" + n.addr(n.restPort)
		if code, _ := httpGet(ctx, rest+"/replica?lag=1048576"); code != http.StatusOK {
			return false
		}
		if code, _ := httpGet(ctx, rest+"/sync"); code == http.StatusOK {
			sync = true
		}
	}
	return sync && p.allStream(ctx, primary)
}

// allStream reports whether every node but primary streams from it, by
// its pg_stat_replication (Patroni names each walreceiver after its node).
func (p *Patroni) allStream(ctx context.Context, primary string) bool {
	dsn, err := p.NodeDSN(primary)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "select application_name from pg_catalog.pg_stat_replication where state = 'streaming'")
	if err != nil {
		return false
	}
	streaming, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return false
	}
	for _, n := range p.nodes {
		if n.name != primary && !slices.Contains(streaming, n.name) {
			return false
		}
	}
	return true
}
