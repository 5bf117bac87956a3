/* The variables a chat template renders from: an OpenAI chat request's
 * `messages`, `tools` and `chat_template_kwargs` checked the way the OpenAI API
 * checks them, and converted into the `data` object of kvg_jinja_render()
 * (jinja.h) the way vLLM converts them for Hugging Face templates.
 *
 * Output: {"messages": [...], "tools": [...] or null, plus every key of
 * chat_template_kwargs}. tools is null, not absent, when the request has none:
 * transformers' apply_chat_template (the reference) renders with tools=None,
 * and templates tell the two apart ("tools is not none" is true of an
 * undefined tools: Mistral's would print an empty tool list). Each output
 * message is, in vLLM's key order (templates that print a message with tojson
 * or iterate its items see it):
 *   role               "system", "user", "assistant" or "tool"; the request's
 *                      "developer" becomes "system" (no template knows it)
 *   content            a string: the request's string, or its text parts joined
 *                      with "\n" (vLLM's "string" content format, which is what
 *                      templates that index message.content as text expect);
 *                      "" for an assistant message that has tool_calls and no
 *                      content (vLLM turns the absent content into no parts)
 *   tool_calls         assistant only, when given: each call as given (its
 *                      unknown fields kept, in order) except function.arguments,
 *                      the JSON text of an object, which becomes that object
 *                      ("" becomes {}) because templates iterate it and print
 *                      it with tojson (vLLM and transformers do the same)
 *   reasoning, reasoning_content
 *                      assistant only, when given: the request's
 *                      reasoning_content, or else its reasoning (vLLM's newer
 *                      name), under both names as vLLM passes it (Qwen reads
 *                      reasoning_content, Gemma 4 reasoning)
 *   tool_call_id       tool only (required there)
 *   name               when given (a string)
 * Every other field is ignored, as OpenAI ignores fields it does not know; a
 * field that is JSON null counts as absent (the SDKs send null for unset).
 *
 * Checks (OpenAI's, with vLLM's where OpenAI says nothing):
 *   messages           a non-empty array of objects
 *   role               required; one of system, developer, user, assistant, tool
 *   content            required (a string, or a non-empty array of
 *                      {"type":"text","text":STRING} parts: other part types
 *                      such as image_url are refused, this server reads text),
 *                      except for an assistant message with tool_calls
 *   name               a string
 *   tool_calls         an array ([] is no tool calls) of {"id": STRING, "type": "function",
 *                      "function": {"name": STRING, "arguments": STRING}},
 *                      arguments valid JSON of an object (or "")
 *   tool_call_id       a string, required on a tool message
 *   reasoning_content, reasoning   a string
 *   tools              an array of {"type": "function", "function": {"name":
 *                      STRING, "description": STRING?, "parameters": OBJECT?}},
 *                      passed on as given (unknown fields included)
 *   chat_template_kwargs  an object; its keys "messages" and "tools" are refused
 *                      (they would replace the request's own). A key the
 *                      trusted variables also have (bos_token,
 *                      add_generation_prompt, ...) is shadowed by them: see
 *                      kvg_jinja_render.
 *
 * Errors are OpenAI's: the message names the parameter as a path
 * ("messages[2].tool_calls[0].function.arguments") and param holds that path. */
#ifndef KVG_CHAT_VARS_H
#define KVG_CHAT_VARS_H

#include <stddef.h>

#include <jansson.h>

/* Results of kvg_chat_vars_build. */
enum {
    KVG_CHAT_VARS_OK = 0,
    KVG_CHAT_VARS_INVALID = -1,   /* the request is wrong: answer 400 with err and param */
    KVG_CHAT_VARS_NOMEM = -2      /* out of memory: err says so, param is "" */
};

/* Builds the template's data object from the request's messages (required),
 * tools and chat_template_kwargs (either may be NULL or JSON null: absent).
 * On KVG_CHAT_VARS_OK *data_out is a new reference (json_decref it); otherwise
 * *data_out is NULL, err (capacity err_len) holds the message and param
 * (capacity param_len) the parameter's path. The inputs are not modified; the
 * data shares their strings (it holds references to them rather than copies),
 * so they must not be changed (json_string_set) while it lives. */
int kvg_chat_vars_build(const json_t *messages, const json_t *tools,
                        const json_t *chat_template_kwargs, json_t **data_out,
                        char *err, size_t err_len, char *param, size_t param_len);

/* The OpenAI error code of a KVG_CHAT_VARS_INVALID message: each message starts
 * the way the API's own do, and the code follows from it
 * ("missing_required_parameter", "invalid_type", "empty_array", else
 * "invalid_value"). */
const char *kvg_chat_vars_error_code(const char *err);

#endif
