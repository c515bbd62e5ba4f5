// Package nilsafe holds one test, over the module's public API: every
// exported method of every exported type, called on a nil receiver and on
// the type's zero value with zero or nil arguments (and a live context),
// returns — without a panic, within a bound — and a method that returns an
// error returns one naming the problem; every exported function, called
// the same way, does too. A test of the types' source keeps its lists of
// types and functions complete. The package has no code of its own.
package nilsafe
