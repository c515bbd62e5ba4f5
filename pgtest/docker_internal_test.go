package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
)

// The Docker path runs only where a daemon answers; these tests pin what it
// asks Docker for, and how it gives up when no daemon is there.

func TestSplitImage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ image, repo, tag string }{
		{"postgres:16-alpine", "postgres", "16-alpine"},
		{"postgres", "postgres", "latest"},
		{"registry.local:5000/pg/postgres:17", "registry.local:5000/pg/postgres", "17"},
		{"registry.local:5000/postgres", "registry.local:5000/postgres", "latest"},
	} {
		repo, tag := splitImage(tc.image)
		if repo != tc.repo || tag != tc.tag {
			t.Errorf("splitImage(%q) = %q, %q; want %q, %q", tc.image, repo, tag, tc.repo, tc.tag)
		}
	}
}

func TestDockerRunOptions(t *testing.T) {
	t.Parallel()
	cfg := newConfig([]Option{WithImage("postgres:16-alpine"), WithMaxConnections(321), WithSetting("max_locks_per_transaction", "10")})
	o := dockerRunOptions(cfg, 54321)
	if o.Repository != "postgres" || o.Tag != "16-alpine" {
		t.Errorf("image %s:%s", o.Repository, o.Tag)
	}
	b := o.PortBindings["5432/tcp"]
	if len(b) != 1 || b[0].HostIP != "127.0.0.1" || b[0].HostPort != "54321" {
		t.Errorf("port bindings %+v: want 5432 on 127.0.0.1:54321 only (fixed across restarts)", o.PortBindings)
	}
	if !slices.Contains(o.Env, "POSTGRES_HOST_AUTH_METHOD=trust") {
		t.Errorf("env %v lacks trust auth", o.Env)
	}
	if !slices.Contains(o.Cmd, "max_connections=321") || !slices.Contains(o.Cmd, "fsync=off") {
		t.Errorf("server args %v", o.Cmd)
	}
	// A setting comes after the defaults, so that it overrides them.
	if i := slices.Index(o.Cmd, "max_locks_per_transaction=10"); i < slices.Index(o.Cmd, "max_locks_per_transaction=128") {
		t.Errorf("server args %v: WithSetting's value does not come after the default", o.Cmd)
	}
	// PID 1 must outlive the postmaster, or Restart would end the container.
	if len(o.Entrypoint) < 3 || !strings.Contains(o.Entrypoint[2], "while :; do docker-entrypoint.sh postgres") {
		t.Errorf("entrypoint %q does not restart postgres in a loop", o.Entrypoint)
	}
}

func TestDockerNoDaemon(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := startDocker(ctx, newConfig(nil))
	if err == nil || !strings.Contains(err.Error(), "no Docker daemon answers") {
		t.Fatalf("startDocker without a daemon: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("giving up on Docker took %v", took)
	}
}

func TestStartNamesAllThreeWays(t *testing.T) {
	t.Setenv("PGTEST_DSN", "")
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	t.Setenv("PGTEST_BINDIR", "/nonexistent")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := Start(ctx)
	if err == nil {
		t.Fatal("Start succeeded with no way to a server")
	}
	for _, want := range []string{"PGTEST_DSN", "Docker", "local binaries", "PGTEST_BINDIR=/nonexistent"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

// TestDockerImageUnavailable proves the fallback when the engine answers but
// the image is neither there nor pullable: a registry that never answers
// (a listener that accepts and stays silent) and one that does not exist.
// Start falls back to local binaries after pullQuiet without progress, logs
// why once, and skips Docker for that image from then on.
func TestDockerImageUnavailable(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	requireEngine(t)
	silent, accepted := silentRegistry(t)
	var mu sync.Mutex
	var logged []string
	saved := logf
	logf = func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, fmt.Sprintf(format, args...))
	}
	t.Cleanup(func() { logf = saved })
	for _, image := range []string{
		silent + "/pgtest/absent:" + randomHex(4),
		"pgtest.invalid/absent:" + randomHex(4),
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		cfg := newConfig([]Option{WithImage(image), WithDSN("")})
		start := time.Now()
		_, err := startDocker(ctx, cfg)
		took := time.Since(start)
		if !errors.Is(err, errNoImage) {
			t.Fatalf("startDocker(%s): %v, want an unavailable image", image, err)
		}
		t.Logf("%s: Docker given up after %v (pullQuiet %v; registry connections accepted: %d): %v",
			image, took.Round(time.Millisecond), pullQuiet, accepted.Load(), err)
		if took > 2*pullQuiet {
			t.Errorf("giving up on %s took %v", image, took)
		}
		start = time.Now()
		s, err := Start(ctx, WithImage(image), WithDSN(""))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Start with %s: %s in %v", image, s, time.Since(start).Round(time.Millisecond))
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if s.Mode() != ModeLocal {
			t.Fatalf("Start with %s: mode %s, want local", image, s.Mode())
		}
		mu.Lock()
		n := len(logged)
		mu.Unlock()
		if n != 1 || !strings.Contains(logged[0], image) || !strings.Contains(logged[0], "falling back to local binaries") {
			t.Fatalf("logged %q, want one line about %s", logged, image)
		}
		logged = nil
	}
}

// requireEngine skips the test when no Docker engine answers (fails in CI
// when a docker command is installed).
func requireEngine(t *testing.T) {
	t.Helper()
	pool, err := dockertest.NewPool("")
	if err == nil {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err = pool.Client.PingWithContext(ctx)
		cancel()
	}
	if err == nil {
		return
	}
	if _, lerr := exec.LookPath("docker"); lerr == nil && os.Getenv("CI") != "" {
		t.Fatalf("no Docker engine answers: %v", err)
	}
	t.Skipf("no Docker engine answers: %v", err)
}

// silentRegistry listens on loopback, accepts connections and never says a
// word: a registry that cannot be reached, as far as a pull can tell. It
// returns its host:port and a count of connections accepted.
func silentRegistry(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	var conns sync.WaitGroup
	done := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conns.Add(1)
			go func() { defer conns.Done(); <-done; c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); close(done); conns.Wait() })
	return ln.Addr().String(), &accepted
}
