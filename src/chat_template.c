/* Built-in chat templates, the pieces that end a turn, and what a model's
 * template is called (chat_template.h). */
#include "chat_template.h"

#include <stdio.h>
#include <string.h>

#include <openssl/sha.h>

/* Each built-in is Jinja like a model's own, so one renderer serves all. */

static const char TPL_PLAIN[] =
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "{{- message['role'] | capitalize ~ ': ' ~ message['content'] ~ '\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- 'Assistant:' -}}\n"
    "{%- endif -%}\n";

static const char TPL_CHATML[] =
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ message['content'] ~ '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n";

/* The system block and the first user text are stripped as one string, as
 * Meta's reference does: the user text keeps its leading spaces, and an empty
 * user text lets the strip take the block's "\n\n". */
static const char TPL_LLAMA2[] =
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "{%- set system = messages[0]['content'] -%}\n"
    "{%- set turns = messages[1:] -%}\n"
    "{%- else -%}\n"
    "{%- set system = none -%}\n"
    "{%- set turns = messages -%}\n"
    "{%- endif -%}\n"
    "{%- if not turns -%}\n"
    "{{- raise_exception('the llama2 chat template needs a user message after the system message') -}}\n"
    "{%- endif -%}\n"
    "{%- for message in turns -%}\n"
    "{%- if message['role'] != ('user' if loop.index0 % 2 == 0 else 'assistant') -%}\n"
    "{{- raise_exception('the llama2 chat template needs roles alternating user/assistant/user/... "
    "after an optional first system message') -}}\n"
    "{%- endif -%}\n"
    "{%- if message['role'] == 'user' and loop.first and system is not none -%}\n"
    "{{- bos_token ~ '[INST] ' ~ ('<<SYS>>\\n' ~ system ~ '\\n<</SYS>>\\n\\n' ~ message['content']) | trim"
    " ~ ' [/INST]' -}}\n"
    "{%- elif message['role'] == 'user' -%}\n"
    "{{- bos_token ~ '[INST] ' ~ message['content'] | trim ~ ' [/INST]' -}}\n"
    "{%- else -%}\n"
    "{{- ' ' ~ message['content'] | trim ~ ' ' ~ eos_token -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n";

static const char TPL_LLAMA3[] =
    "{{- bos_token -}}\n"
    "{%- for message in messages -%}\n"
    "{{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ message['content'] | trim"
    " ~ '<|eot_id|>' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "{%- endif -%}\n";

static const struct {
    const char *name, *src;
} BUILTINS[] = {
    { "plain", TPL_PLAIN }, { "chatml", TPL_CHATML }, { "llama2", TPL_LLAMA2 }, { "llama3", TPL_LLAMA3 },
};

const char *kvg_chat_builtin(const char *name)
{
    for (size_t i = 0; name && i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (strcmp(name, BUILTINS[i].name) == 0)
            return BUILTINS[i].src;
    return NULL;
}

static const char *const STOPSTR_PLAIN[] = { "\nUser:" };

const char *const *kvg_chat_builtin_stop_strings(const char *name, size_t *n)
{
    if (name && strcmp(name, "plain") == 0) {
        *n = 1;
        return STOPSTR_PLAIN;
    }
    *n = 0;
    return NULL;
}

/* The end-of-turn (and end-of-text) tokens of current chat models, as their
 * generation configs list them: Llama 3 (eot, eom, end_of_text), ChatML models
 * (Qwen, SmolLM3, Nemotron, Kimi, LFM2), Gemma, Phi-3/4 and gpt-oss, DeepSeek,
 * Command-R, GLM (which ends a turn by starting the next: <|user|>,
 * <|observation|>), Llama 2 / Mistral (</s>). */
static const char *const END_PIECES[] = {
    "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>",
    "<end_of_turn>", "<|end|>", "<|return|>", "<|call|>", "<|EOT|>",
    /* DeepSeek's <｜end▁of▁sentence｜> (split: "\x9c" "e" must not read as "\x9ce") */
    ("<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
    "<|END_OF_TURN_TOKEN|>", "<|user|>", "<|observation|>", "</s>",
};

const char *const *kvg_chat_end_pieces(size_t *n)
{
    *n = sizeof END_PIECES / sizeof END_PIECES[0];
    return END_PIECES;
}

void kvg_chat_template_describe(kvg_chat_template_info *info, kvg_chat_origin origin,
                                const char *name, const char *source,
                                const char *src, size_t len)
{
    unsigned char md[SHA256_DIGEST_LENGTH];

    memset(info, 0, sizeof *info);
    info->origin = origin;
    snprintf(info->name, sizeof info->name, "%s", origin == KVG_CHAT_NONE ? "none" : name);
    if (origin == KVG_CHAT_NONE)
        return;
    snprintf(info->source, sizeof info->source, "%s", source ? source : "");
    SHA256((const unsigned char *)(src ? src : ""), src ? len : 0, md);
    for (int i = 0; i < 8; i++)
        snprintf(info->sha256 + 2 * i, 3, "%02x", md[i]);
}

const char *kvg_chat_template_summary(const kvg_chat_template_info *info, char *buf, size_t len)
{
    switch (info->origin) {
    case KVG_CHAT_MODEL:
        snprintf(buf, len, "the model's own (%s, sha256 %s)", info->source, info->sha256);
        break;
    case KVG_CHAT_FILE:
        snprintf(buf, len, "file %s (sha256 %s)", info->source, info->sha256);
        break;
    case KVG_CHAT_BUILTIN:
        snprintf(buf, len, "built-in %s", info->name);
        break;
    default:
        snprintf(buf, len, "none");
        break;
    }
    return buf;
}
