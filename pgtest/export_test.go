package pgtest

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
