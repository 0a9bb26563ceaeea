// Blueprint-facing types of the plugin: typed errors, the connection state and the delegates of
// a streamed reply.
#pragma once

#include <string>

#include "CoreMinimal.h"
#include "IgiClient.h"
#include "IgiTypes.generated.h"

USTRUCT(BlueprintType)
struct IGISDK_API FIgiError
{
	GENERATED_BODY()

	// stable code: the sidecar's (PROTOCOL.md §6) or the client's own (unavailable, stream_lost,
	// wrong_sidecar, unsupported, message_too_large, stopped)
	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	FString Code;

	// for people; never parse it
	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	FString Message;

	// true: the same request may succeed later unchanged (retry with back-off)
	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	bool bRetryable = false;
};

UENUM(BlueprintType)
enum class EIgiConnectionState : uint8
{
	Connecting,
	Ready,
	Unavailable,
	Refused,
	Closed
};

DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(FIgiTokenSignature, const FString&, Token);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FIgiDoneSignature, const FString&, Text, const FString&, FinishReason);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(FIgiErrorSignature, const FIgiError&, Error);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(FIgiConnectionSignature, EIgiConnectionState, State);
DECLARE_DYNAMIC_MULTICAST_DELEGATE(FIgiSignal);

// How the NPC's replies are sampled (open_session's `sampling`; applies from the session's next
// opening). A negative value leaves the sidecar's default.
USTRUCT(BlueprintType)
struct IGISDK_API FIgiSampling
{
	GENERATED_BODY()

	// 0..5 (0: greedy); default 0.7
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	float Temperature = -1.f;

	// (0, 1]; default 0.95
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	float TopP = -1.f;

	// 0..100000 (0: off); default 40
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	int32 TopK = -1;

	// 0..1; default 0.05
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	float MinP = -1.f;

	// 0.5..3; default 1.1
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	float RepeatPenalty = -1.f;

	// 0..2^32-1; default 0
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	int64 Seed = -1;
};

// An image the NPC sees with a line: the bytes of a PNG or JPEG file (16 MiB at most; the model
// needs its vision projector, else the line fails with vision_unavailable).
USTRUCT(BlueprintType)
struct IGISDK_API FIgiImage
{
	GENERATED_BODY()

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	TArray<uint8> Data;
};

// An action an NPC may take besides talking (protocol 1.3, a "tool" on the wire): its name, what
// it does (the model reads this) and the JSON Schema of its arguments object.
USTRUCT(BlueprintType)
struct IGISDK_API FIgiAction
{
	GENERATED_BODY()

	// [A-Za-z0-9_-], 1..64 characters; not auto, none or required
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	FString Name;

	// at most 2000 characters
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk", meta = (MultiLine = true))
	FString Description;

	// the arguments' JSON Schema as JSON text, e.g. {"type": "object", "properties": {"target":
	// {"type": "string", "enum": ["wolf", "bandit"]}}, "required": ["target"]}; empty: any object
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk", meta = (MultiLine = true))
	FString ParametersJson;
};

// One call of an action the NPC made. Its arguments are JSON text valid against the action's
// schema (the sidecar constrains decoding to it).
USTRUCT(BlueprintType)
struct IGISDK_API FIgiActionCall
{
	GENERATED_BODY()

	// what AnswerAction answers ("call_...")
	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	FString CallId;

	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	FString Name;

	// the arguments object as JSON text
	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	FString ArgumentsJson;

	// its place in the reply (0, 1, ...)
	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	int32 Index = 0;
};

// What came of one call, sent with the next line (tool_results).
USTRUCT(BlueprintType)
struct IGISDK_API FIgiActionResult
{
	GENERATED_BODY()

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	FString CallId;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk", meta = (MultiLine = true))
	FString Result;
};

DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(FIgiActionSignature, const FIgiActionCall&, Call);

// One line's options (chat's fields). Empty ones are not sent.
USTRUCT(BlueprintType)
struct IGISDK_API FIgiChatOptions
{
	GENERATED_BODY()

	// 1..4096; 0: the component's MaxTokens
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	int32 MaxTokens = 0;

	// at most 8 strings of 1..64 characters; a match ends the reply (finish reason stop_string)
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	TArray<FString> Stop;

	// a GBNF grammar (root rule `root`); at most one of Grammar and JsonSchema
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk", meta = (MultiLine = true))
	FString Grammar;

	// a JSON Schema, as JSON text: the reply is JSON that follows it
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk", meta = (MultiLine = true))
	FString JsonSchema;

	// at most 4; each goes before the text, or where the text holds <__media__>
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	TArray<FIgiImage> Images;

	// protocol 1.3: what the NPC may do with this reply (at most 32; not with Grammar or
	// JsonSchema); empty: the NPC component's Actions
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	TArray<FIgiAction> Actions;

	// auto (empty), none, required, or an action's name (exactly that action)
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	FString ActionChoice;

	// false: at most one action per reply
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	bool bParallelActions = true;

	// what came of the previous reply's calls: the reply continues from them (at most 16)
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	TArray<FIgiActionResult> ActionResults;
};

UENUM(BlueprintType)
enum class EIgiLevelLoadOutcome : uint8
{
	// the VRAM asked for is free: load now
	Granted,
	// no grant within the frame deadline (or the sidecar's 5 s): load anyway, the model yields as it can
	DeadlinePassed,
	// the sidecar refused (cannot_free, forbidden, ...): Error says why; load anyway
	Refused,
	// no sidecar to ask (a dedicated server, not started, or down): load
	NoSidecar
};

// The answer to BeginLevelLoad: the game loads its level whatever it is; it says why now.
USTRUCT(BlueprintType)
struct IGISDK_API FIgiLevelLoadResult
{
	GENERATED_BODY()

	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	EIgiLevelLoadOutcome Outcome = EIgiLevelLoadOutcome::NoSidecar;

	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	FIgiError Error;

	// game frames from the call to this answer
	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	int32 FramesWaited = 0;
};

DECLARE_DYNAMIC_MULTICAST_DELEGATE_OneParam(FIgiLevelLoadSignature, const FIgiLevelLoadResult&, Result);

// What a C++ caller hears about one request (all optional). Called on the game thread, from the
// subsystem's tick. A chat gets OnToken per token, then exactly one of OnDone / OnError; any
// other request exactly one of OnOk / OnError.
struct FIgiCallbacks
{
	TFunction<void(const FString& Token)> OnToken;
	TFunction<void(const FString& Text, const FString& FinishReason)> OnDone;
	// a chat's whole `done` body (usage, timings), just before OnDone
	TFunction<void(const igi::MsgValue& Body)> OnDoneBody;
	// protocol 1.3: each action call as soon as it is whole (before OnDone)
	TFunction<void(const FIgiActionCall& Call)> OnAction;
	// a chat's calls, as done lists them (empty: it only talked), just before OnDone
	TFunction<void(const TArray<FIgiActionCall>& Calls)> OnDoneActions;
	TFunction<void(const igi::MsgValue& Body)> OnOk;
	TFunction<void(const FIgiError& Error)> OnError;
};

namespace IgiUnreal
{
	inline std::string ToUtf8(const FString& Text)
	{
		return std::string(TCHAR_TO_UTF8(*Text));
	}

	inline FString FromUtf8(const std::string& Text)
	{
		return FString(UTF8_TO_TCHAR(Text.c_str()));
	}

	inline FIgiActionCall ToActionCall(const igi::ToolCall& Call)
	{
		FIgiActionCall Out;
		Out.CallId = FromUtf8(Call.id);
		Out.Name = FromUtf8(Call.name);
		Out.ArgumentsJson = FromUtf8(Call.arguments);
		Out.Index = Call.index;
		return Out;
	}

	inline FIgiError ToError(const igi::Error& Error)
	{
		FIgiError Out;
		Out.Code = FromUtf8(Error.code);
		Out.Message = FromUtf8(Error.message);
		Out.bRetryable = Error.retryable;
		return Out;
	}
}
