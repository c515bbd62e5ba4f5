package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// pullQuiet is how long a pull may go without progress before pgtest gives
// up on the image and falls back to local binaries: a registry that cannot
// be reached (no route, packets dropped, DNS that never answers) shows no
// progress at all, while a pull that works streams progress every second
// or so, however long the whole download takes.
const pullQuiet = 4 * time.Second

// errNoDaemon wraps the reasons Docker was not tried at all: no client, no
// daemon answering. Start falls back from those silently; from any other
// Docker failure it falls back with a log line.
var errNoDaemon = errors.New("no Docker daemon")

// errNoImage wraps the reason an image cannot be had; its log line is
// written once per process and image, by ensureImage.
var errNoImage = errors.New("image not available")

// unavailable remembers, for the life of the process, the images that could
// not be had, with why: later starts skip Docker for them at once, and the
// fallback is logged once.
var unavailable sync.Map // image → error

// logf reports a fallback from Docker to local binaries (tests replace it).
var logf = func(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pgtest: "+format+"\n", args...)
}

// ensureImage makes sure image is present on the daemon: there already, or
// pulled. A pull that shows no progress for pullQuiet is abandoned.
func ensureImage(ctx context.Context, pool *dockertest.Pool, image string) error {
	if err, ok := unavailable.Load(image); ok {
		return err.(error)
	}
	_, err := pool.Client.InspectImage(image)
	if err == nil {
		return nil
	}
	if !errors.Is(err, dc.ErrNoSuchImage) {
		return fmt.Errorf("inspect image %s: %w", image, err)
	}
	if err := pull(ctx, pool.Client, image); err != nil {
		err = fmt.Errorf("%w: %s is not on the engine, and %w", errNoImage, image, err)
		if ctx.Err() == nil { // not the caller's deadline: the image's fault
			if _, loaded := unavailable.LoadOrStore(image, err); !loaded {
				logf("Docker answers, but %v; falling back to local binaries (set PGTEST_IMAGE to a local image, see pgtest/image/build.sh, or PGTEST_DOCKER=0)", err)
			}
		}
		return err
	}
	return nil
}

// pull pulls image, giving up when the daemon reports no progress for
// pullQuiet — also before its first word, which a registry that cannot be
// reached may never let it say.
func pull(ctx context.Context, client *dc.Client, image string) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stalled := fmt.Errorf("no progress for %v", pullQuiet)
	timer := time.AfterFunc(pullQuiet, func() { cancel(stalled) })
	defer timer.Stop()
	progress := writerFunc(func(p []byte) (int, error) {
		timer.Reset(pullQuiet)
		return len(p), nil
	})
	repo, tag := splitImage(image)
	err := client.PullImage(dc.PullImageOptions{
		Repository: repo, Tag: tag, Context: ctx, OutputStream: progress,
	}, dc.AuthConfiguration{})
	if err != nil && context.Cause(ctx) == stalled {
		return fmt.Errorf("pull: %w", stalled)
	}
	if err != nil {
		return fmt.Errorf("pull: %w", err)
	}
	return nil
}

// writerFunc is an io.Writer.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
