// Command anthropic is a complete agent loop on the official anthropic-sdk-go: the model
// is offered minipy, each tool_use it asks for is run in a namespace that persists for the
// conversation, the tool_result goes back, and the loop ends when the model answers.
//
//	ANTHROPIC_API_KEY=... go run ./anthropic "What is the 100th prime?"
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/minipy-go/minipy"
)

// maxTurns bounds the model's requests in one conversation.
const maxTurns = 20

var errTooManyTurns = errors.New("the model was still calling tools after the last turn")

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

// ask sends prompt to the model with minipy as its tool and runs the tool calls it makes
// until it answers in text.
func ask(ctx context.Context, client anthropic.Client, model anthropic.Model, prompt string) (string, error) {
	ns := minipy.NewNamespace()
	defer ns.Close()
	opts := &minipy.Options{Globals: ns}
	t := minipy.ToolSchemaFor(opts)
	tools := []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: t.Name, Description: anthropic.String(t.Description),
		InputSchema: anthropic.ToolInputSchemaParam{Properties: t.InputSchema.Properties, Required: t.InputSchema.Required}}}}
	messages := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}
	for range maxTurns {
		msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
			Model: model, MaxTokens: 4096, Messages: messages, Tools: tools,
		})
		if err != nil {
			return "", err
		}
		messages = append(messages, msg.ToParam())
		var answer strings.Builder
		var results []anthropic.ContentBlockParamUnion
		for _, block := range msg.Content {
			switch b := block.AsAny().(type) {
			case anthropic.TextBlock:
				answer.WriteString(b.Text)
			case anthropic.ToolUseBlock:
				text, isError := "[error]\nThere is no tool named "+b.Name+".\n", true
				if b.Name == minipy.ToolName {
					text, isError = minipy.CallTool(ctx, b.Input, opts)
				}
				results = append(results, anthropic.NewToolResultBlock(b.ID, text, isError))
			}
		}
		if len(results) == 0 {
			return answer.String(), nil
		}
		messages = append(messages, anthropic.NewUserMessage(results...))
	}
	return "", errTooManyTurns
}
