package lease_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pglocks/pglocks/lease"
)

func TestHandleText(t *testing.T) {
	t.Parallel()
	for _, h := range []lease.Handle{
		{Name: "report:monthly", Owner: uuid.New(), Token: 42},
		{Name: "a:b:c: spaces and ünïcødé", Owner: uuid.New(), Token: 1},
		{Name: ":", Owner: uuid.New(), Token: 1<<63 - 1},
	} {
		text, err := h.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		got, err := lease.ParseHandle(string(text))
		if err != nil || got != h {
			t.Fatalf("ParseHandle(%s) = %+v, %v; want %+v", text, got, err, h)
		}
		// In a queue job, as JSON.
		type job struct {
			Lease lease.Handle `json:"lease"`
		}
		js, err := json.Marshal(job{h})
		if err != nil {
			t.Fatal(err)
		}
		var back job
		if err := json.Unmarshal(js, &back); err != nil || back.Lease != h {
			t.Fatalf("JSON %s → %+v, %v", js, back.Lease, err)
		}
	}
	for _, bad := range []string{
		"", "v2:1:" + uuid.NewString() + ":x", "v1:x:" + uuid.NewString() + ":x",
		"v1:1:not-a-uuid-not-a-uuid-not-a-uuid-xx:x", "v1:1:" + uuid.NewString() + ":",
		"v1:0:" + uuid.NewString() + ":x", "v1:1:" + uuid.NewString(),
	} {
		if _, err := lease.ParseHandle(bad); err == nil {
			t.Errorf("ParseHandle(%q) succeeded", bad)
		}
	}
}

// TestResume: an API process acquires and hands the lease to a worker
// through a job; the worker resumes it with another store and pool.
func TestResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	api := mustTry(t, b.store, "job:42", time.Minute)
	job, err := json.Marshal(api.Handle())
	if err != nil {
		t.Fatal(err)
	}

	worker := newStore(t, b.db.NewPool(t), lease.Config{})
	var h lease.Handle
	if err := json.Unmarshal(job, &h); err != nil {
		t.Fatal(err)
	}
	l, err := worker.Resume(ctx, h, lease.WithKeepAlive())
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() != api.Token() || l.Owner() != api.Owner() || l.TTL() != time.Minute {
		t.Fatalf("resumed %v/%d ttl %v, want %v/%d ttl 1m", l.Owner(), l.Token(), l.TTL(), api.Owner(), api.Token())
	}
	if err := l.Assert(ctx, 50*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := worker.Resume(ctx, h); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("resume after release: %v, want ErrNotHeld", err)
	}
	if err := api.Renew(ctx); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("the API's copy after the worker's release: %v, want ErrNotHeld", err)
	}
}
