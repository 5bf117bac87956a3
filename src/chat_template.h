/* Which chat template a model gets, and what a chat turn ends on.
 *
 * Templates are Jinja (jinja.h renders them). Where one comes from, in order:
 *   1. the operator's choice (`kvgate-engine --chat-template NAME|FILE`): a file
 *      of Jinja, or one of the built-ins below by name;
 *   2. the model's own: GGUF `tokenizer.chat_template`, tokenizer_config.json's
 *      `chat_template`, or a chat_template.jinja beside the weights;
 *   3. none: chat requests are refused with a 400 that says so. There is no
 *      silent fallback: a base model fed a chat format it never saw answers
 *      nonsense, and nothing would tell the user why.
 * kvg_chat_template_info says which, for the ready line, /v1/models and /status.
 *
 * The built-ins exist only as explicit choices, for models that ship no
 * template (llama2.c checkpoints, base models), written for this project:
 *   "plain"   {{bos_token}}System: ...\nUser: ...\nAssistant: ...\n ... "Assistant:"
 *             (roles capitalized; the model would write the user's next turn,
 *             so "\nUser:" is a stop string: kvg_chat_builtin_stop_strings)
 *   "chatml"  <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
 *   "llama2"  Meta's Llama-2-chat format: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n
 *             {user} [/INST] {assistant} </s><s>[INST] ... — a system message only
 *             first, then user/assistant alternating from user (it raises
 *             otherwise); content stripped as the reference does
 *   "llama3"  <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n
 *             {content stripped}<|eot_id|> ... — the Llama-3.0 format, without the
 *             dated "Cutting Knowledge" header of 3.1 (whose prompts change daily) */
#ifndef KVG_CHAT_TEMPLATE_H
#define KVG_CHAT_TEMPLATE_H

#include <stddef.h>

#define KVG_CHAT_BUILTIN_NAMES "plain, chatml, llama2 or llama3"

/* The Jinja source of a built-in, NULL when name is not one. */
const char *kvg_chat_builtin(const char *name);

/* Plain-text stop strings a built-in implies (applied like a request's "stop"):
 * "plain" has "\nUser:"; the others and non-built-ins none. */
const char *const *kvg_chat_builtin_stop_strings(const char *name, size_t *n);

/* Special-token pieces that end an assistant turn in the templates of current
 * models ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|return|>", ...), for
 * the engine to stop on besides EOS: look each up in the vocabulary and keep
 * those it has, except "<|end|>" when the vocabulary also has "<|return|>"
 * (gpt-oss: "<|end|>" closes its analysis message, the answer follows). */
const char *const *kvg_chat_end_pieces(size_t *n);

/* Where a model's template came from. */
typedef enum kvg_chat_origin {
    KVG_CHAT_NONE = 0,           /* no template: chat is refused */
    KVG_CHAT_MODEL,              /* the model's own */
    KVG_CHAT_FILE,               /* --chat-template FILE */
    KVG_CHAT_BUILTIN             /* --chat-template NAME */
} kvg_chat_origin;

/* What the ready line, /v1/models and /status say about it. */
typedef struct kvg_chat_template_info {
    kvg_chat_origin origin;
    char name[32];               /* "model", "file", or the built-in's name; "none" */
    char source[200];            /* where: "GGUF tokenizer.chat_template of PATH",
                                    "PATH", "built-in"; "" for none */
    char sha256[17];             /* first 16 hex digits of the source's SHA-256
                                    (tells two templates apart); "" for none */
} kvg_chat_template_info;

/* Fills info (sha256 from src[0..len) unless origin is NONE). */
void kvg_chat_template_describe(kvg_chat_template_info *info, kvg_chat_origin origin,
                                const char *name, const char *source,
                                const char *src, size_t len);

/* "the model's own (GGUF tokenizer.chat_template of x.gguf, sha256 0123...)",
 * "built-in llama3", "file t.jinja (sha256 ...)", "none" into buf. */
const char *kvg_chat_template_summary(const kvg_chat_template_info *info, char *buf,
                                      size_t len);

#endif
