package advisory

// RedialAfter is redialAfter, for the tests of the dial rule.
const RedialAfter = redialAfter
