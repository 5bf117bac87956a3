/* Chat templates: turn a list of chat messages into the prompt a model was
 * trained on, as a list of SEGMENTS rather than one string.
 *
 * Why segments: a template's own markers ("<|im_start|>", "<|eot_id|>", ...) must
 * become special tokens, while message content must never do so — otherwise a
 * user who types "<|im_start|>system" forges a system turn. So the worker
 * tokenizes each segment separately:
 *   KVG_SEG_TEMPLATE  template text: encode with KVG_ENC_PARSE_SPECIAL
 *   KVG_SEG_CONTENT   message content: encode WITHOUT KVG_ENC_PARSE_SPECIAL;
 *                     this is the only kind the normalizer (src/normalize.h) may
 *                     rewrite (into the worker's own buffer, replacing the
 *                     segment's text/len) — template text is passed through
 *                     byte for byte
 *   KVG_SEG_BOS       the vocabulary's BOS id (kvg_tokenizer_bos()); when the
 *                     vocabulary has none, encode .text with KVG_ENC_PARSE_SPECIAL
 *   KVG_SEG_EOS       the same with kvg_tokenizer_eos()
 * and concatenates the ids. Tokenizing per segment can differ from tokenizing the
 * concatenated string at segment edges (e.g. SentencePiece adds its dummy-prefix
 * space at the start of every encode call); that is the price of the guarantee,
 * and it is deterministic, which is what the prefix cache needs.
 *
 * The concatenated text (kvg_chat_segments_text, chat_template_testing.h) is exactly what the Hugging Face
 * reference template renders for the same messages with add_generation_prompt,
 * bos_token and eos_token filled in; use it for logs and debugging only.
 *
 * Templates (selected by configuration name or detected from model metadata):
 *   "llama2"  <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>
 *             <s>[INST] {user} [/INST]   — Meta's Llama-2-chat template: a system
 *             message is only allowed first, then roles must alternate
 *             user/assistant starting with user (as the reference raises an
 *             exception otherwise); user/assistant content is stripped of
 *             surrounding ASCII whitespace. No generation prompt exists: the
 *             prompt ends after " [/INST]". Note "[INST]" and "<<SYS>>" are plain
 *             text in the Llama-2 vocabulary, so they cannot be protected; only
 *             <s> and </s> are.
 *   "chatml"  <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
 *             (no content stripping, any role order; no default system prompt)
 *   "llama3"  <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
 *             ... <|start_header_id|>assistant<|end_header_id|>\n\n — the Llama-3.0
 *             template (content stripped; no dated "Cutting Knowledge" system
 *             header, which would make every day's prompts a different prefix)
 *   "plain"   "System: {content}\nUser: {content}\nAssistant: {content}\n" ...
 *             "Assistant:" — fallback for models without a chat template.
 *
 * BOS: llama2 and llama3 put BOS segments in themselves (the worker must not add
 * another); chatml and plain do not, and the worker applies the model's usual
 * BOS policy, the same as for /v1/completions (kvg_chat_template_has_bos).
 *
 * Rendering allocates nothing: segments point at static strings and into the
 * messages' content, which must outlive them. */
#ifndef KVG_CHAT_TEMPLATE_H
#define KVG_CHAT_TEMPLATE_H

#include <stddef.h>

typedef enum kvg_chat_role {
    KVG_ROLE_SYSTEM = 0,        /* also the request's "developer" role */
    KVG_ROLE_USER,
    KVG_ROLE_ASSISTANT
} kvg_chat_role;

typedef struct kvg_chat_message {
    kvg_chat_role role;
    const char *content;        /* valid UTF-8, not necessarily NUL-terminated */
    size_t content_len;
} kvg_chat_message;

typedef enum kvg_chat_template {
    KVG_TPL_PLAIN = 0,
    KVG_TPL_LLAMA2,
    KVG_TPL_CHATML,
    KVG_TPL_LLAMA3
} kvg_chat_template;

#define KVG_TPL_COUNT 4

typedef enum kvg_seg_kind {
    KVG_SEG_TEMPLATE = 0,
    KVG_SEG_CONTENT,
    KVG_SEG_BOS,
    KVG_SEG_EOS
} kvg_seg_kind;

typedef struct kvg_chat_segment {
    kvg_seg_kind kind;
    const char *text;           /* not NUL-terminated in general */
    size_t len;
} kvg_chat_segment;

/* "plain", "llama2", "chatml", "llama3" (case-sensitive; configuration values).
 * Returns 0, or -1 with err listing the accepted names. */
int kvg_chat_template_from_name(const char *name, kvg_chat_template *out,
                                char *err, size_t err_len);
const char *kvg_chat_template_name(kvg_chat_template t);

/* Picks a template from a model's Jinja chat_template (GGUF
 * "tokenizer.chat_template" or tokenizer_config.json "chat_template") by the
 * markers it contains: "<|start_header_id|>" -> llama3, "<|im_start|>" -> chatml,
 * "[INST]" -> llama2 (Mistral's [INST] variant included, approximately), anything
 * else, NULL or empty -> plain. */
kvg_chat_template kvg_chat_template_detect(const char *jinja, size_t len);

/* 1 when the template emits its own BOS segment. */
int kvg_chat_template_has_bos(kvg_chat_template t);

/* Special-token pieces that end an assistant turn, for the engine to stop on
 * (look each up with kvg_tokenizer_find_piece; skip those the vocabulary lacks):
 *   llama2 "</s>"; chatml "<|im_end|>", "<|endoftext|>";
 *   llama3 "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"; plain none. */
const char *const *kvg_chat_template_stop_pieces(kvg_chat_template t, size_t *n);

/* Plain-text stop strings the template implies (applied like a request's
 * "stop"): plain "\nUser:" (the model would otherwise write the user's next
 * turn); none for the others. */
const char *const *kvg_chat_template_stop_strings(kvg_chat_template t, size_t *n);

/* Capacity of the segment array that kvg_chat_render() may need for n messages. */
size_t kvg_chat_max_segments(size_t n_messages);

/* Renders msgs into segs (capacity cap; kvg_chat_max_segments(n) suffices) and
 * stores the count in *n_segs. add_generation_prompt appends the assistant header
 * (ignored by llama2, which has none). Returns 0, or -1 with err (the gateway
 * answers 400 with param "messages"): no messages, cap too small, or a
 * conversation the template cannot express (llama2's role rules). */
int kvg_chat_render(kvg_chat_template t, const kvg_chat_message *msgs, size_t n,
                    int add_generation_prompt, kvg_chat_segment *segs, size_t cap,
                    size_t *n_segs, char *err, size_t err_len);

#endif
