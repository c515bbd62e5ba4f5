package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// dockerExpire is how long a container may live: dockertest kills it then
// even if every other cleanup failed.
const dockerExpire = 2 * 60 * 60 // seconds

// docker is a throwaway server in a container.
type docker struct {
	pool     *dockertest.Pool
	resource *dockertest.Resource
	reaper   *reaper
	dsn      string
	addr     string // host:port the DSN connects to
}

func startDocker(ctx context.Context, cfg config) (*Server, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("%w: no Docker client: %w", errNoDaemon, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := pool.Client.PingWithContext(pingCtx); err != nil {
		return nil, fmt.Errorf("%w answers at %s: %w", errNoDaemon, pool.Client.Endpoint(), err)
	}
	if err := ensureImage(ctx, pool, cfg.image); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	res, err := pool.RunWithOptions(dockerRunOptions(cfg, port), func(hc *dc.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = dc.RestartPolicy{Name: "no"}
		// The cluster in memory: a throwaway one needs no disk, and a
		// per-test database is copied 3-4× faster than on the image's
		// overlay filesystem (measured on fuse-overlayfs).
		hc.Tmpfs = map[string]string{dockerDataParent: "mode=1777"}
	})
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", cfg.image, err)
	}
	d := &docker{pool: pool, resource: res, addr: fmt.Sprintf("127.0.0.1:%d", port),
		dsn: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", port)}
	ok := false
	defer func() {
		if !ok {
			_ = d.close()
		}
	}()
	if d.reaper, err = startReaper("", res.Container.ID, ""); err != nil {
		return nil, err
	}
	if err := res.Expire(dockerExpire); err != nil {
		return nil, err
	}
	if err := waitReady(ctx, d.dsn, 2*time.Minute); err != nil {
		return nil, fmt.Errorf("container %s not ready: %w", shortID(res.Container.ID), err)
	}
	d.preferDirect(ctx)
	s := newServer(ModeDocker, cfg, d.dsn, d)
	if err := s.init(ctx); err != nil {
		return nil, fmt.Errorf("container %s: %w", shortID(res.Container.ID), err)
	}
	ok = true
	return s, nil
}

// dockerDataParent holds PGDATA (/var/lib/postgresql/data) in the official
// image and in pgtest/image/build.sh's.
const dockerDataParent = "/var/lib/postgresql"

// preferDirect switches to the container's own address when this host
// reaches it (Linux, local engine) and finds the same server there: every
// round trip then skips docker-proxy (0.15 ms instead of 0.65 ms for a
// SELECT 1 here). Otherwise the published loopback port stays.
func (d *docker) preferDirect(ctx context.Context) {
	ip := d.resource.Container.NetworkSettings.IPAddress
	if ip == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	direct := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", net.JoinHostPort(ip, "5432"))
	a, errA := systemID(ctx, d.dsn)
	b, errB := systemID(ctx, direct)
	if errA == nil && errB == nil && a == b {
		d.dsn, d.addr = direct, net.JoinHostPort(ip, "5432")
	}
}

// systemID returns the cluster's system identifier, unique to its initdb.
func systemID(ctx context.Context, dsn string) (int64, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var id int64
	err = conn.QueryRow(ctx, "select system_identifier from pg_control_system()").Scan(&id)
	return id, err
}

// dockerRunOptions runs the image with PID 1 a loop that starts PostgreSQL
// again whenever it exits, so that Restart can stop the server inside the
// container without the container (AutoRemove) going away. The host port is
// fixed, so a DSN stays valid across restarts.
func dockerRunOptions(cfg config, hostPort int) *dockertest.RunOptions {
	repo, tag := splitImage(cfg.image)
	args := []string{
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=" + strconv.Itoa(cfg.maxConns),
		"-c", "max_locks_per_transaction=128",
	}
	args = append(args, cfg.settingArgs()...)
	return &dockertest.RunOptions{
		Repository: repo,
		Tag:        tag,
		Env:        []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_INITDB_ARGS=--no-sync"},
		Entrypoint: []string{"/bin/sh", "-c", `while :; do docker-entrypoint.sh postgres "$@"; done`, "pgtest"},
		Cmd:        args,
		Labels: map[string]string{"org.pglocks.pgtest": "1", "org.pglocks.pgtest.pid": strconv.Itoa(os.Getpid()),
			"org.pglocks.pgtest.tmpdir": os.TempDir()},
		PortBindings: map[dc.Port][]dc.PortBinding{
			"5432/tcp": {{HostIP: "127.0.0.1", HostPort: strconv.Itoa(hostPort)}},
		},
	}
}

// splitImage splits "repo:tag" (the repo may hold a registry host:port).
func splitImage(image string) (repo, tag string) {
	i := strings.LastIndexByte(image, ':')
	if i < 0 || strings.ContainsRune(image[i:], '/') {
		return image, "latest"
	}
	return image[:i], image[i+1:]
}

func shortID(id string) string { return id[:min(12, len(id))] }

// waitReady polls dsn until a connection succeeds, for at most limit.
// (Not dockertest's Pool.Retry: its backoff sleeps seconds between tries,
// which were most of a container's start.)
func waitReady(ctx context.Context, dsn string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		err := ping(ctx, dsn)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

func ping(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// restart stops the postmaster inside the container (a fast shutdown); the
// entrypoint loop starts it again. Done when a new postmaster answers.
func (d *docker) restart(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, d.dsn)
	if err != nil {
		return err
	}
	var before time.Time
	err = conn.QueryRow(ctx, "select pg_postmaster_start_time()").Scan(&before)
	_ = conn.Close(ctx)
	if err != nil {
		return err
	}
	code, err := d.resource.Exec([]string{"sh", "-c", `kill -INT "$(head -n 1 "$PGDATA/postmaster.pid")"`}, dockertest.ExecOptions{})
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("signal postmaster in container %s: exit status %d", shortID(d.resource.Container.ID), code)
	}
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		if started, err := startTime(ctx, d.dsn); err == nil && started.After(before) {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(errors.New("server did not come back"), context.Cause(ctx))
		case <-time.After(delay):
		}
	}
}

func startTime(ctx context.Context, dsn string) (time.Time, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return time.Time{}, err
	}
	defer conn.Close(ctx)
	var t time.Time
	err = conn.QueryRow(ctx, "select pg_postmaster_start_time()").Scan(&t)
	return t, err
}

func (d *docker) close() error {
	err := d.pool.Purge(d.resource)
	if d.reaper != nil {
		d.reaper.dismiss()
	}
	return err
}

func (d *docker) describe() string {
	return fmt.Sprintf("%s (container %s)", d.addr, shortID(d.resource.Container.ID))
}
