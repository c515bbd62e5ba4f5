package pgtest_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
	"github.com/pglocks/pglocks/pgtest"
)

// Docker mode, for real, on the engine of this machine: the same proofs as
// local mode, on a server in a container. The image is PGTEST_IMAGE, else
// the one image/build.sh builds from this machine's PostgreSQL (cached).
// Without an engine the tests skip; in CI they fail if a docker command is
// installed but no engine answers.

var dockerSetup struct {
	once  sync.Once
	pool  *dockertest.Pool
	image string
	skip  string // why the tests cannot run
}

// dockerImage returns the image for Docker-mode tests and a client of the
// engine, or skips (fails in CI where an engine should answer).
func dockerImage(t *testing.T) (string, *dockertest.Pool) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: Docker-mode tests start containers")
	}
	if os.Getenv("PGTEST_DOCKER") == "0" {
		t.Skip("PGTEST_DOCKER=0: no Docker-mode tests")
	}
	dockerSetup.once.Do(func() {
		pool, err := dockertest.NewPool("")
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = pool.Client.PingWithContext(ctx)
			cancel()
		}
		if err != nil {
			dockerSetup.skip = "no Docker engine answers: " + err.Error()
			return
		}
		dockerSetup.pool = pool
		if dockerSetup.image = os.Getenv("PGTEST_IMAGE"); dockerSetup.image != "" {
			return
		}
		var stderr bytes.Buffer
		cmd := exec.Command("image/build.sh")
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			dockerSetup.skip = "image/build.sh: " + err.Error() + ": " + stderr.String()
			return
		}
		dockerSetup.image = strings.TrimSpace(string(out))
		t.Logf("%s", strings.TrimSpace(stderr.String()))
	})
	if dockerSetup.skip != "" {
		_, haveDocker := exec.LookPath("docker")
		if os.Getenv("CI") != "" && haveDocker == nil {
			t.Fatal(dockerSetup.skip)
		}
		t.Skip(dockerSetup.skip)
	}
	return dockerSetup.image, dockerSetup.pool
}

func TestDocker(t *testing.T) {
	t.Parallel()
	image, pool := dockerImage(t)
	start := time.Now()
	srv := pgtest.NewServer(t, pgtest.WithImage(image))
	if srv.Mode() != pgtest.ModeDocker {
		t.Fatalf("server %s: mode %s, want docker", srv, srv.Mode())
	}
	t.Logf("%s started in %v", srv, time.Since(start).Round(time.Millisecond))
	t.Run("Shared", func(t *testing.T) {
		t.Run("New", func(t *testing.T) { t.Parallel(); testNew(t, srv) })
		t.Run("TerminateBackend", func(t *testing.T) { t.Parallel(); testTerminateBackend(t, srv) })
		t.Run("TerminateApplication", func(t *testing.T) { t.Parallel(); testTerminateApplication(t, srv) })
		t.Run("Proxy", func(t *testing.T) { t.Parallel(); testProxy(t, srv) })
		t.Run("CreateDatabaseTime", func(t *testing.T) { t.Parallel(); logCreateDatabaseTime(t, srv) })
	})
	// Restart and Close need the server to themselves.
	t.Run("Restart", func(t *testing.T) { testRestart(t, srv) })
	t.Run("RequirePasswords", func(t *testing.T) { testRequirePasswords(t, srv) })
	t.Run("CloseRemovesContainer", func(t *testing.T) {
		id := containerID(t, srv)
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		waitContainerGone(t, pool, id)
	})
}

// TestDockerTeardown proves that the container goes when its test binary
// is SIGKILLed, which leaves only the watchdog to remove it.
func TestDockerTeardown(t *testing.T) {
	t.Parallel()
	image, pool := dockerImage(t)
	child := teardownChild(t, "sigkill", "PGTEST_DOCKER=1", "PGTEST_IMAGE="+image)
	waitContainerGone(t, pool, child.where)
}

// containerID returns the ID, as the container knows it (its hostname), of
// a Docker-mode server.
func containerID(t *testing.T, srv *pgtest.Server) string {
	t.Helper()
	var id string
	if err := connect(t, srv.DSN()).QueryRow(ctxT(t, 30*time.Second),
		"select trim(pg_read_file('/etc/hostname'), E'\\n')").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// waitContainerGone waits until the engine no longer knows container id.
func waitContainerGone(t *testing.T, pool *dockertest.Pool, id string) {
	t.Helper()
	var last error
	waitFor(t, ctxT(t, 2*time.Minute), func() bool {
		_, last = pool.Client.InspectContainer(id)
		var gone *dc.NoSuchContainer
		return errors.As(last, &gone)
	}, func() string { return "container " + id + " remains: inspect says " + errString(last) })
}

func errString(err error) string {
	if err == nil {
		return "it exists"
	}
	return err.Error()
}

// logCreateDatabaseTime reports what a per-test database costs on srv.
func logCreateDatabaseTime(t *testing.T, srv *pgtest.Server) {
	var took []time.Duration
	for range 5 {
		start := time.Now()
		srv.NewDB(t)
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	t.Logf("per-test database on %s: median %v of %d (min %v, max %v)",
		srv.Mode(), took[len(took)/2].Round(time.Millisecond), len(took),
		took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
}

// testRequirePasswords proves RequirePasswords on srv, which no other test
// may be using: a role's wrong password is refused, its right one and
// pgtest's own superuser connections still work.
func testRequirePasswords(t *testing.T, srv *pgtest.Server) {
	ctx := ctxT(t, time.Minute)
	if err := srv.RequirePasswords(ctx); err != nil {
		t.Fatal(err)
	}
	db := srv.NewDB(t) // pgtest's superuser still connects
	if _, err := db.Conn(t).Exec(ctx, "create role pgtest_pw login password 'right'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if conn, err := pgx.Connect(ctx, srv.DSN()); err == nil {
			_, _ = conn.Exec(ctx, "drop role if exists pgtest_pw")
			_ = conn.Close(ctx)
		}
	})
	for pw, want := range map[string]string{"right": "", "wrong": "28P01"} {
		cfg, err := pgx.ParseConfig(db.DSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.User, cfg.Password = "pgtest_pw", pw
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			_ = conn.Close(ctx)
		}
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("password %q: %v, want %q", pw, err, want)
		}
	}
}
