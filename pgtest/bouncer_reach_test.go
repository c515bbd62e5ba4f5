package pgtest_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/pgtest"
)

// TestBouncerReach: a bouncer takes clients on loopback and from a
// partition link (a Partitionable proxy in front of it, whose connections
// cross a veth pair), and refuses every other address — its hba file
// trusts those two ranges only, like a local-mode server's pg_hba.conf.
func TestBouncerReach(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	b, dsn := db.Bouncer(t, pgtest.PoolSession)
	if got := currentDatabase(t, connect(t, dsn)); got != db.Name {
		t.Fatalf("on loopback: %q", got)
	}
	p := pgtest.NewProxy(t, b.Addr(), pgtest.Partitionable())
	pdsn, err := pgtest.ViaProxy(dsn, p)
	if err != nil {
		t.Fatal(err)
	}
	if got := currentDatabase(t, connect(t, pdsn)); got != db.Name {
		t.Fatalf("across a partition link: %q", got)
	}
	other := otherAddress(t)
	if other == "" {
		t.Skip("no non-loopback IPv4 address outside the partition range to try")
	}
	_, port, _ := net.SplitHostPort(b.Addr())
	odsn, err := pgtest.ViaProxy(dsn, pgtest.NewProxy(t, net.JoinHostPort(other, port)))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctxT(t, 30*time.Second), odsn)
	if err == nil {
		_ = conn.Close(ctxT(t, 10*time.Second))
		t.Fatalf("the bouncer took a client from %s", other)
	}
	t.Logf("from %s: %v", other, err)
}

// otherAddress returns an IPv4 address of this host outside loopback and
// the partition links' range, or "".
func otherAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.To4() == nil || n.IP.IsLoopback() || strings.HasPrefix(n.IP.String(), "10.251.") {
			continue
		}
		return n.IP.String()
	}
	return ""
}
