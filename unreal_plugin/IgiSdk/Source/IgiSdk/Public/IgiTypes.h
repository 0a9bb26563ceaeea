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

// What a C++ caller hears about one request (all optional). Called on the game thread, from the
// subsystem's tick. A chat gets OnToken per token, then exactly one of OnDone / OnError; any
// other request exactly one of OnOk / OnError.
struct FIgiCallbacks
{
	TFunction<void(const FString& Token)> OnToken;
	TFunction<void(const FString& Text, const FString& FinishReason)> OnDone;
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

	inline FIgiError ToError(const igi::Error& Error)
	{
		FIgiError Out;
		Out.Code = FromUtf8(Error.code);
		Out.Message = FromUtf8(Error.message);
		Out.bRetryable = Error.retryable;
		return Out;
	}
}
