package pgtest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
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
	cfg := newConfig([]Option{WithImage("postgres:16-alpine"), WithMaxConnections(321)})
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
