package advisory

import (
	"context"
	"testing"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/pgtest"
)

// Every dedicated session carries the hygiene settings of its Config.
// (The LISTEN connection's idle_session_timeout is 0: TestHealthyIdleHolderKept.)
func TestSessionHygieneSettings(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	// Database defaults the sessions must override (set, not startup
	// parameters: a pooler rejects unknown startup parameters). Each is
	// non-zero but cannot fire during the dial itself: the session settings
	// are a statement sent after the startup handshake, so a 1 ms
	// idle_session_timeout (or statement_timeout) would race the client's
	// own turn-around from ReadyForQuery to that statement, which a loaded
	// machine stretches past 1 ms (CI saw 57P05 here).
	admin := db.Conn(t)
	if _, err := admin.Exec(context.Background(), "alter database "+db.Name+
		" set statement_timeout = '30s'; alter database "+db.Name+" set lock_timeout = '1ms'; "+
		"alter database "+db.Name+" set idle_in_transaction_session_timeout = '1ms'; "+
		"alter database "+db.Name+" set idle_session_timeout = '30s'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "alter database "+db.Name+" reset all") })
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
		current_setting('tcp_user_timeout'), current_setting('synchronous_commit'),
		current_setting('statement_timeout'), current_setting('lock_timeout'),
		current_setting('idle_in_transaction_session_timeout'), current_setting('idle_session_timeout')`)
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
	// idle_session_timeout is TCPUserTimeout on a session that holds
	// locks: the server's bound behind a session-mode pooler.
	want := []string{"hygiene", "7", "2", "4", "12500", "off", "0", "0", "0", "12500ms"}
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
