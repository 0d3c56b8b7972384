// Package minipy runs Python code strings in a real, embedded CPython, for LLM tool loops:
// the last expression's value, the printed output and a clean traceback, with a timeout
// that user code cannot swallow, in namespaces that persist between runs.
package minipy
