package minipy_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

func TestLastExpressionValue(t *testing.T) {
	r, err := minipy.Minipy("import math; math.factorial(12)", nil)
	require.NoError(t, err)
	assert.True(t, r.HasValue)
	assert.Equal(t, int64(479001600), r.Value)
	assert.Equal(t, "479001600", r.Repr)
}
