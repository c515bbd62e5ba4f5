package leader

import "github.com/pglocks/pglocks"

// observeTerm reports the start (leading) or end of a term to the
// Observer.
func (e *Elector) observeTerm(term int64, leading bool, reason error) {
	if o := e.cfg.Observer; o != nil && o.Leader != nil {
		o.Leader(pglocks.LeaderEvent{Election: e.cfg.Name, Identity: e.cfg.Identity, Leading: leading, Term: term, Reason: reason})
	}
}
