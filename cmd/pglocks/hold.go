package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// trustEvery is how often pglocks passes its lock's trust deadline on to
// the job's supervisor, when it has moved.
const trustEvery = 100 * time.Millisecond

// runHolding runs argv as a job (see startJob) while h is held, forwards
// signals to it, keeps its supervisor told until when the lock is held
// for sure (its dead-man's switch), stops the whole job if h is lost, and
// releases h once no process of the job is left.
func runHolding(h *held, argv []string, killAfter time.Duration, stderr io.Writer) error {
	sigs := notifySignals()
	defer signal.Stop(sigs)
	spec := jobSpec{argv: argv, killAfter: killAfter, stderr: stderr, trusted: h.trusted()}
	spec.session = sessionOf(h, stderr)
	j, err := startJob(spec)
	if err != nil {
		release(h)
		return err
	}
	tick := time.NewTicker(trustEvery)
	defer tick.Stop()
	sent, lost, expired := spec.trusted, false, j.expired()
	for {
		select {
		case <-j.done():
			return finish(h, j, lost, argv[0], stderr)
		case s := <-sigs:
			j.forward(s)
		case <-tick.C:
			if t := h.trusted(); !lost && t.After(sent) {
				j.trust(t)
				sent = t
			}
		case <-expired: // the supervisor is stopping the job, and said why
			expired, lost = nil, true
		case <-h.lost:
			h.lost = nil
			lost = true
			fmt.Fprintf(stderr, "pglocks: lock lost while %s ran (%v); sending SIGTERM\n", argv[0], h.err())
			j.stop()
		}
	}
}

// finish decides pglocks' status once no process of the job is left: 76
// if the lock was lost while the job ran — announced, found when its trust
// ran out (the supervisor's dead-man's switch, or pglocks' own check now),
// or found by the release — else CMD's status, after the release.
func finish(h *held, j job, lost bool, name string, stderr io.Writer) error {
	h.trusted() // a lease whose trust deadline has passed ends, as lost
	select {
	case <-h.lost:
		lost = true
	case <-j.expired():
		lost = true
	default:
	}
	if lost {
		return exitCode(exitLost)
	}
	if h.result != nil {
		h.result(j.err())
	}
	if err := release(h); err != nil {
		if h.notHeld(err) {
			fmt.Fprintf(stderr, "pglocks: lock lost while %s ran (the release found it: %v)\n", name, err)
			return exitCode(exitLost)
		}
		fmt.Fprintf(stderr, "pglocks: release after %s: %v\n", name, err)
	}
	return statusOf(j.err())
}

// notifySignals relays the signals pglocks forwards to CMD's process group
// (SIGTERM, SIGHUP, SIGQUIT, SIGINT) and contSignals; a signal ignored when
// pglocks started (nohup's SIGHUP, a background job's SIGINT) stays
// ignored, by pglocks and, as it inherits the disposition, by CMD.
func notifySignals() chan os.Signal {
	sigs := make(chan os.Signal, 8)
	for _, s := range []os.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, os.Interrupt} {
		if !signal.Ignored(s) {
			signal.Notify(sigs, s)
		}
	}
	if len(contSignals) > 0 { // none would mean all
		signal.Notify(sigs, contSignals...)
	}
	return sigs
}

// sessionOf returns a duplicate of the socket of h's session for the
// supervisor, or nil, saying why not.
func sessionOf(h *held, stderr io.Writer) *os.File {
	if h.session == nil {
		return nil
	}
	f, err := h.session()
	if err != nil {
		fmt.Fprintf(stderr, "pglocks: the supervisor cannot hold the lock's session (%v): "+
			"should pglocks be killed, the server may free the lock before the job is dead\n", err)
		return nil
	}
	return f
}

// jobSpec is what startJob needs.
type jobSpec struct {
	argv      []string
	killAfter time.Duration
	stderr    io.Writer
	trusted   time.Time // the lock's trust deadline at the start
	session   *os.File  // the lock session's socket, or nil; startJob closes it
}

// job is CMD and the processes it starts, run under the lock.
type job interface {
	// forward sends a signal pglocks received to CMD's process group
	// (SIGCONT: continues CMD, if stopped).
	forward(os.Signal)
	// stop stops every process of the job: SIGTERM now, SIGKILL at
	// --kill-after.
	stop()
	// trust extends the deadline at which the job is stopped as on a
	// loss, should pglocks not extend it again (it is stopped or hung).
	trust(until time.Time)
	// expired is closed once the job was stopped because that deadline
	// passed (nil: never).
	expired() <-chan struct{}
	// done is closed once no process of the job is left.
	done() <-chan struct{}
	// err is CMD's exit, for statusOf, once done is closed.
	err() error
}

func release(h *held) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return h.release(ctx)
}

// statusOf turns CMD's exit into pglocks' exit status.
func statusOf(err error) error {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err != nil {
			return err
		}
		return nil
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitCode(128 + int(ws.Signal()))
	}
	return exitCode(ee.ExitCode())
}
