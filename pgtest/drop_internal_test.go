package pgtest

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"testing"
	"time"
)

// TestDrop pins both firewall tools' rules, without a server: a dial from
// the namespace to a listener of ours fails while either direction is
// dropped (the SYN, or the SYN-ACK), and succeeds once healed.
func TestDrop(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"nft", "iptables"} {
		t.Run(tool, func(t *testing.T) {
			t.Parallel()
			l, err := newNetLink()
			if errors.Is(err, ErrUnsupported) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer l.close()
			if tool == "iptables" {
				if _, err := exec.LookPath("iptables-restore"); err != nil {
					t.Skip(err)
				}
				if l.tool == "nft" { // empty the nft chains, then switch
					if err := l.drop(false, false); err != nil {
						t.Fatal(err)
					}
					l.tool = "iptables"
				}
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(l.rootIP, "0"))
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					_ = c.Close()
				}
			}()
			for _, d := range []struct{ toServer, toClient bool }{{true, true}, {true, false}, {false, true}} {
				if err := l.drop(d.toServer, d.toClient); err != nil {
					t.Fatal(err)
				}
				if err := dialOnce(l, ln.Addr().String(), 300*time.Millisecond); err == nil {
					t.Fatalf("%s: a dial crossed drop(toServer=%v, toClient=%v)", tool, d.toServer, d.toClient)
				}
				if err := l.drop(false, false); err != nil {
					t.Fatal(err)
				}
				if err := dialOnce(l, ln.Addr().String(), 30*time.Second); err != nil {
					t.Fatalf("%s: dial after healing: %v", tool, err)
				}
			}
		})
	}
}

func dialOnce(l *netLink, addr string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c, err := l.dial(ctx, addr)
	if err == nil {
		_ = c.Close()
	}
	return err
}
