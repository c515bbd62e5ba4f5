package lease_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pglocks/pglocks/internal/outcome"
	"github.com/pglocks/pglocks/lease"
)

// TestHostnameCheckedAtNew: a Config.Hostname the
// server would refuse as text is refused by New, naming the field, not by
// the first acquisition.
func TestHostnameCheckedAtNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, h := range []string{"host\x00name", "h\xffst"} {
		s, err := lease.New(b.pool, lease.Config{Hostname: h})
		if err == nil {
			_ = s.Close(ctxT(t))
			t.Errorf("New with Hostname %q accepted", h)
			continue
		}
		t.Logf("Hostname %q: %v", h, err)
		if !errors.Is(err, lease.ErrInvalidConfig) || !strings.Contains(err.Error(), "Config.Hostname") {
			t.Errorf("New with Hostname %q = %v, want ErrInvalidConfig naming Config.Hostname", h, err)
		}
	}
}

// TestMetadataCheckedBeforeSending: metadata that
// is JSON but that PostgreSQL's jsonb refuses is refused before any
// statement, with an error naming WithMetadata that retrying cannot cure
// (an elector's campaign gives up at once on it), and the name stays
// free.
func TestMetadataCheckedBeforeSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	for _, doc := range []string{
		`{"identity":"a\u0000b"}`, `"\ud800"`, `"\udc00x"`, `[1e131072]`, `0.5e-16383`, "\"\xff\"",
	} {
		_, err := b.store.TryAcquire(ctx, "meta", time.Minute, lease.WithMetadata(json.RawMessage(doc)))
		t.Logf("metadata %q: %v", doc, err)
		if err == nil || !strings.Contains(err.Error(), "WithMetadata") || outcome.Of(err) != outcome.Fatal {
			t.Errorf("metadata %q: %v (%v), want a fatal error naming WithMetadata", doc, err, outcome.Of(err))
		}
	}
	if held, err := b.store.IsHeld(ctx, "meta"); err != nil || held {
		t.Fatalf("IsHeld = %v, %v", held, err)
	}
	l := mustTry(t, b.store, "meta", time.Minute, lease.WithMetadata(json.RawMessage(`{"a":"\u00e9\ud83d\ude00","n":[1e131071,1e-16383,-0]}`)))
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
