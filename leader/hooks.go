package leader

import "sync"

// dispatcher runs hook calls one at a time, in order, on a goroutine of its
// own, so that a slow hook never holds up the election. close waits for the
// calls already queued.
type dispatcher struct {
	mu     sync.Mutex
	queue  []func()
	signal chan struct{} // cap 1
	quit   chan struct{}
	done   chan struct{}
}

func newDispatcher() *dispatcher {
	d := &dispatcher{signal: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go d.run()
	return d
}

// do queues f; it never blocks.
func (d *dispatcher) do(f func()) {
	d.mu.Lock()
	d.queue = append(d.queue, f)
	d.mu.Unlock()
	select {
	case d.signal <- struct{}{}:
	default:
	}
}

func (d *dispatcher) run() {
	defer close(d.done)
	for {
		d.mu.Lock()
		q := d.queue
		d.queue = nil
		d.mu.Unlock()
		for _, f := range q {
			f()
		}
		if len(q) > 0 {
			continue
		}
		select {
		case <-d.signal:
		case <-d.quit:
			d.mu.Lock()
			empty := len(d.queue) == 0
			d.mu.Unlock()
			if empty {
				return
			}
		}
	}
}

// close runs what is queued and stops the goroutine.
func (d *dispatcher) close() {
	close(d.quit)
	<-d.done
}
