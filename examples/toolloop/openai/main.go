// Command openai is the same agent loop as ../anthropic on the official openai-go, with
// the Chat Completions API: minipy is offered as a function tool, each tool call is run in
// a namespace that persists for the conversation and answered with a tool message. Tool
// messages take only text, so the images the code showed (plots, display() of a picture)
// follow the turn's tool messages in one user message, as data URLs.
//
//	OPENAI_API_KEY=... go run ./openai "What is the 100th prime?"
package main

import (
	"context"
	"encoding/base64"
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
		var shown []shownImages
		for _, call := range msg.ToolCalls {
			r := minipy.ToolResult{Text: "[error]\nThere is no tool named " + call.Function.Name + ".\n"}
			if call.Function.Name == minipy.ToolName {
				// Chat Completions has no error flag on tool results: the text's labels say it.
				r = minipy.CallToolResult(ctx, []byte(call.Function.Arguments), opts)
			}
			messages = append(messages, openai.ToolMessage(r.Text, call.ID))
			if len(r.Images) > 0 {
				shown = append(shown, shownImages{call.ID, r.Images})
			}
		}
		if len(shown) > 0 {
			messages = append(messages, imagesMessage(shown, len(msg.ToolCalls) > 1))
		}
	}
	return "", errTooManyTurns
}

// shownImages are the images of one tool call.
type shownImages struct {
	callID string
	images []minipy.Image
}

// imagesMessage is the user message that shows the model the images of a turn's tool
// calls, which tool messages cannot carry: a text part saying which is which ("[image N:
// ...]" in a call's text is its Nth; with byCall, which call's), then the images in that
// order, as data URLs.
func imagesMessage(shown []shownImages, byCall bool) openai.ChatCompletionMessageParamUnion {
	var names []string
	var parts []openai.ChatCompletionContentPartUnionParam
	for _, s := range shown {
		for i, img := range s.images {
			name := fmt.Sprintf("image %d", i+1)
			if byCall {
				name += " of " + s.callID
			}
			names = append(names, name)
			parts = append(parts, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{
				URL: "data:" + img.MIMEType + ";base64," + base64.StdEncoding.EncodeToString(img.Data),
			}))
		}
	}
	intro := "Images shown by the minipy tool call above, in order: "
	if byCall {
		intro = "Images shown by the minipy tool calls above, in order: "
	}
	return openai.UserMessage(append([]openai.ChatCompletionContentPartUnionParam{
		openai.TextContentPart(intro + strings.Join(names, ", ") + "."),
	}, parts...))
}
