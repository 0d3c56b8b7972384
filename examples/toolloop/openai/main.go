// Command openai is the same agent loop as ../anthropic on the official openai-go, with
// the Chat Completions API: minipy is offered as a function tool, each tool call is run in
// a namespace that persists for the conversation and answered with a tool message.
//
//	OPENAI_API_KEY=... go run ./openai "What is the 100th prime?"
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/openai/openai-go/v3"

	"github.com/minipy-go/minipy"
)

// maxTurns bounds the model's requests in one conversation.
const maxTurns = 20

var (
	errTooManyTurns = errors.New("the model was still calling tools after the last turn")
	errNoChoice     = errors.New("the response has no choices")
)

func main() {
	prompt := "What is the 100th prime number? Compute it."
	if len(os.Args) > 1 {
		prompt = strings.Join(os.Args[1:], " ")
	}
	client := openai.NewClient() // reads OPENAI_API_KEY
	answer, err := ask(context.Background(), client, openai.ChatModelGPT4o, prompt)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(answer)
}

// ask sends prompt to the model with minipy as its tool and runs the tool calls it makes
// until it answers in text.
func ask(ctx context.Context, client openai.Client, model openai.ChatModel, prompt string) (string, error) {
	ns := minipy.NewNamespace()
	defer ns.Close()
	opts := &minipy.Options{Globals: ns}
	t := minipy.ToolSchemaFor(opts)
	tools := []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
		Name: t.Name, Description: openai.String(t.Description), Parameters: t.InputSchema.Map(),
	})}
	messages := []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}
	for range maxTurns {
		completion, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: model, Messages: messages, Tools: tools,
		})
		if err != nil {
			return "", err
		}
		if len(completion.Choices) == 0 {
			return "", errNoChoice
		}
		msg := completion.Choices[0].Message
		if len(msg.ToolCalls) == 0 {
			return msg.Content, nil
		}
		messages = append(messages, msg.ToParam())
		for _, call := range msg.ToolCalls {
			text := "[error]\nThere is no tool named " + call.Function.Name + ".\n"
			if call.Function.Name == minipy.ToolName {
				// Chat Completions has no error flag on tool results: the text's labels say it.
				text, _ = minipy.CallTool(ctx, []byte(call.Function.Arguments), opts)
			}
			messages = append(messages, openai.ToolMessage(text, call.ID))
		}
	}
	return "", errTooManyTurns
}
