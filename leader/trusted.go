package leader

import "time"

// Trusted returns this candidate's term while it leads and trusts it: the
// term of [Elector.Current], if its [Term.TrustedUntil] is after now. It
// costs no round trip. Reading a passed deadline ends the term (see
// TrustedUntil), so a false answer is final for that term.
func (e *Elector) Trusted() (Term, bool) {
	t, ok := e.Current()
	if !ok || !time.Now().Before(t.TrustedUntil()) {
		return Term{}, false
	}
	return t, true
}
