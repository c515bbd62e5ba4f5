package pgtest

import (
	"context"
	"time"
)

// poolAhead is how many clones of a template a server keeps made ahead.
const poolAhead = 2

// dbPool makes clones of one template ahead of demand: each take asks for
// one more, made in the background while the test runs, so that the next
// test finds its database ready instead of waiting for the copy. It makes
// nothing until the first take, and at most poolAhead ahead. A clone whose
// CREATE DATABASE failed is not offered; should its outcome be unknown (the
// connection lost), the database may exist: on a throwaway server it goes
// with the server, in ModeDSN a later run's sweep drops it (sweep.go).
type dbPool struct {
	s        *Server
	template string
	ready    chan *DB
	want     chan struct{}
	done     chan struct{} // closed when fill returned
}

// pool returns the pool of template, started on first use.
func (s *Server) pool(template string) *dbPool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pools[template]
	if p == nil {
		p = &dbPool{s: s, template: template, ready: make(chan *DB, poolAhead),
			want: make(chan struct{}, poolAhead), done: make(chan struct{})}
		select {
		case <-s.stopping: // closed: no filling, every take clones
			close(p.done)
		default:
			go p.fill()
		}
		s.pools[template] = p
	}
	return p
}

// take returns a clone made ahead if one is ready, else makes one now; it
// asks for the next either way.
func (p *dbPool) take(ctx context.Context) (*DB, error) {
	select {
	case p.want <- struct{}{}:
	default:
	}
	select {
	case d := <-p.ready:
		return d, nil
	default:
		return p.s.clone(ctx, p.template)
	}
}

// fill makes one clone per request until the server closes.
func (p *dbPool) fill() {
	defer close(p.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.s.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		select {
		case <-p.s.stopping:
			return
		case <-p.want:
		}
		cctx, ccancel := context.WithTimeout(ctx, time.Minute)
		d, err := p.s.clone(cctx, p.template)
		ccancel()
		if err != nil {
			continue
		}
		select {
		case p.ready <- d:
		default:
			p.s.dropQuietly(d.Name)
		}
	}
}

// stopPools waits for every pool's filler to stop. The clones nobody took
// go with a throwaway server, or with this run's databases in ModeDSN
// (dropRun).
func (s *Server) stopPools() {
	s.mu.Lock()
	pools := make([]*dbPool, 0, len(s.pools))
	for _, p := range s.pools {
		pools = append(pools, p)
	}
	s.mu.Unlock()
	for _, p := range pools {
		<-p.done
	}
}

func (s *Server) dropQuietly(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = s.dropDatabase(ctx, name)
}
