package main

import (
	"context"
	"testing"
	"time"

	"github.com/pglocks/pglocks/advisory"
)

// The trust deadline of an advisory lock, which the package doc and run -h
// quote (7s after its session last answered), comes before the server may
// free the lock of a silent session.
func TestAdvisoryTrust(t *testing.T) {
	cfg := lockConfig(context.Background())
	trust := serverHold(cfg) - trustMargin
	if trust != 7*time.Second {
		t.Errorf("an advisory lock is trusted %v after its session last answered; the docs say 7s", trust)
	}
	if trust >= cfg.TCPUserTimeout || trust >= cfg.KeepalivesIdle+cfg.KeepalivesInterval*time.Duration(cfg.KeepalivesCount) {
		t.Errorf("trust %v is not below the server's bounds (%+v)", trust, cfg)
	}
	if cfg.TCPUserTimeout != advisory.DefaultTCPUserTimeout {
		t.Errorf("pglocks run's TCPUserTimeout %v is not the default", cfg.TCPUserTimeout)
	}
}
