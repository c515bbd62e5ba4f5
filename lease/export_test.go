package lease

import "time"

// Waiters returns how many Acquire calls of name are registered with the
// store's listener: waiting, or about to.
func Waiters(s *Store, name string) int {
	s.mu.Lock()
	lis := s.lis
	s.mu.Unlock()
	if lis == nil {
		return 0
	}
	lis.mu.Lock()
	defer lis.mu.Unlock()
	return len(lis.waiters[name])
}

// Parked returns how many Acquire calls of the store are blocked waiting
// for a release or an expiry.
func Parked(s *Store) int64 { return s.parked.Load() }

// Listening reports whether the store's listener has a listening session.
func Listening(s *Store) bool {
	s.mu.Lock()
	lis := s.lis
	s.mu.Unlock()
	if lis == nil {
		return false
	}
	lis.mu.Lock()
	defer lis.mu.Unlock()
	return lis.on
}

// Polling reports whether the store's listener found it cannot listen
// (transaction pooling) and its waiters poll.
func Polling(s *Store) bool {
	s.mu.Lock()
	lis := s.lis
	s.mu.Unlock()
	return lis != nil && lis.polls()
}

// PollInterval is pollInterval, for test logs.
const PollInterval = pollInterval

// SetMinRenewInterval lowers s's bound on a kept-alive lease's renewal
// interval below MinRenewInterval, for a test that races renewals on
// purpose (TestReleaseRacesKeepAlive). Call it before s is used.
func SetMinRenewInterval(s *Store, d time.Duration) { s.minRenew = d }
