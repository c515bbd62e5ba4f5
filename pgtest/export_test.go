package pgtest

// TemplateNameForTest is templateName, for the external tests.
func TemplateNameForTest(hash string) string { return templateName(hash) }
