// Command anthropic is a complete agent loop on the official anthropic-sdk-go (the loop
// itself is examples/agent): the model is offered minipy, each tool_use it asks for is run
// in a namespace that persists for the conversation, the tool_result goes back (with an
// image block for each plot or picture the code showed), and the loop ends when the model
// answers.
//
//	ANTHROPIC_API_KEY=... go run ./toolloop/anthropic "What is the 100th prime?"
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/examples/agent"
)

func main() {
	prompt := "What is the 100th prime number? Compute it."
	if len(os.Args) > 1 {
		prompt = strings.Join(os.Args[1:], " ")
	}
	client := anthropic.NewClient() // reads ANTHROPIC_API_KEY
	answer, err := ask(context.Background(), client, anthropic.ModelClaudeSonnet4_5, prompt)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(answer)
}

// ask runs one conversation in a namespace of its own.
func ask(ctx context.Context, client anthropic.Client, model anthropic.Model, prompt string) (string, error) {
	ns := minipy.NewNamespace()
	defer ns.Close()
	return agent.Claude(ctx, client, model, &minipy.Options{Globals: ns}, prompt)
}
