package leader

import "errors"

var (
	errNilElector  = errors.New("leader: nil *Elector (make one with leader.New)")
	errZeroElector = errors.New("leader: zero Elector (make one with leader.New)")
)

// usable returns why e cannot be used — nil, or not made by New — else nil.
// Every exported method checks it first: a nil or zero Elector gives an
// error (or a zero result), never a panic.
func (e *Elector) usable() error {
	switch {
	case e == nil:
		return errNilElector
	case e.life == nil:
		return errZeroElector
	}
	return nil
}
