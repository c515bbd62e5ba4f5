package pgtest

// TemplateNameForTest is templateName, for the external tests.
func TemplateNameForTest(hash string) string { return templateName(hash) }

// RandomTokenForTest is a fresh random token.
func RandomTokenForTest() string { return randomHex(8) }
