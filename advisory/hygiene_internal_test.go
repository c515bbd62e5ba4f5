package advisory

import (
	"context"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/pgtest"
)

// Every dedicated session carries the hygiene settings of its Config.
func TestSessionHygieneSettings(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	pool := db.NewPool(t)
	l, err := New(pool, Config{ApplicationName: "hygiene", KeepalivesIdle: 7 * time.Second,
		KeepalivesInterval: 2 * time.Second, KeepalivesCount: 4, TCPUserTimeout: 12500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func() {
		if err := l.Close(ctx); err != nil {
			t.Error(err)
		}
	}()
	lk, err := l.TryLock(ctx, pglocks.KeyOf("hygiene"))
	if err != nil {
		t.Fatal(err)
	}
	s := lk.sess
	s.mu.Lock()
	res := s.conn.Exec(ctx, `select current_setting('application_name'), current_setting('tcp_keepalives_idle'),
		current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count'),
		current_setting('tcp_user_timeout'), current_setting('synchronous_commit')`)
	results, err := res.ReadAll()
	s.deadline = time.Time{} // re-arm the socket deadline on next use
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range results[0].Rows[0] {
		got = append(got, string(v))
	}
	want := []string{"hygiene", "7", "2", "4", "12500", "off"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("session settings = %q, want %q", got, want)
			break
		}
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
