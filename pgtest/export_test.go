package pgtest

import "time"

// TemplateNameForTest is templateName, for the external tests.
func TemplateNameForTest(hash string) string { return templateName(hash) }

// RunLockLostForTest is the error of a run's lock lost and not taken back,
// for the external tests.
func RunLockLostForTest(s *Server) error {
	l := s.runLock
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// SetRunLockCheckForTest sets how often a run's watchdog checks its lock,
// for runs started after it, and puts it back at the test's end.
func SetRunLockCheckForTest(t interface{ Cleanup(func()) }, d time.Duration) {
	old := runLockCheck
	runLockCheck = d
	t.Cleanup(func() { runLockCheck = old })
}

// RunLockChecksForTest is how many checks s's watchdog has done.
func RunLockChecksForTest(s *Server) int64 {
	if s.runLock == nil {
		return 0
	}
	return s.runLock.checks.Load()
}

// NextPortForTest makes the next pooler started in front of s pick port,
// as if another listener had taken it after it was found free.
func NextPortForTest(s *Server, port int) { s.nextPort.Store(int32(port)) }
