package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// dial connects to addr from inside the namespace: the socket is created on
// an OS thread switched into it, and keeps the namespace after the switch
// back.
func (l *netLink) dial(ctx context.Context, addr string) (c net.Conn, err error) {
	err = inNetns(l.ns, func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// inNetns runs f on an OS thread switched into the network namespace ns
// (a name under /run/netns, as ip netns makes): a socket f creates, and a
// process f starts, live there for good. The thread switches back after
// f, or, if it cannot, stays locked and exits with its goroutine.
func inNetns(ns string, f func() error) error {
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		return err
	}
	defer target.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		err = f()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}
