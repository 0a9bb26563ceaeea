#include "IgiUnrealSocket.h"

#include "IPAddress.h"
#include "Sockets.h"
#include "SocketSubsystem.h"

namespace
{
	// the longest single FSocket::Wait: bounds how late a Wake() is noticed
	constexpr int32 SliceMs = 2;
}

FIgiUnrealSocket::~FIgiUnrealSocket()
{
	Close();
}

bool FIgiUnrealSocket::Connect(const std::string& Host, uint16_t Port, int TimeoutMs, std::string& Error)
{
	Close();
	ISocketSubsystem* Subsystem = ISocketSubsystem::Get(PLATFORM_SOCKETSUBSYSTEM);
	if (Subsystem == nullptr)
	{
		Error = "no socket subsystem";
		return false;
	}
	TSharedRef<FInternetAddr> Address = Subsystem->CreateInternetAddr();
	bool bValid = false;
	Address->SetIp(UTF8_TO_TCHAR(Host.c_str()), bValid);
	if (!bValid)
	{
		Error = "not an IP address: " + Host;
		return false;
	}
	Address->SetPort(Port);
	Socket = Subsystem->CreateSocket(NAME_Stream, TEXT("igi-sdk"), Address->GetProtocolType());
	if (Socket == nullptr)
	{
		Error = "cannot create a socket";
		return false;
	}
	Socket->SetNoDelay(true);
	Socket->SetNonBlocking(true);
	Socket->Connect(*Address);
	if (!Socket->Wait(ESocketWaitConditions::WaitForWrite, FTimespan::FromMilliseconds(TimeoutMs))
		|| Socket->GetConnectionState() != SCS_Connected)
	{
		Error = "connection refused or timed out";
		Close();
		return false;
	}
	return true;
}

bool FIgiUnrealSocket::SendAll(const uint8_t* Data, size_t Count, int TimeoutMs)
{
	size_t Sent = 0;
	while (Sent < Count)
	{
		if (Socket == nullptr)
		{
			return false;
		}
		int32 Chunk = 0;
		const int32 Want = static_cast<int32>(FMath::Min<size_t>(Count - Sent, 1 << 20));
		if (!Socket->Send(Data + Sent, Want, Chunk))
		{
			return false;
		}
		if (Chunk > 0)
		{
			Sent += static_cast<size_t>(Chunk);
			continue;
		}
		if (!Socket->Wait(ESocketWaitConditions::WaitForWrite, FTimespan::FromMilliseconds(TimeoutMs)))
		{
			return false;
		}
	}
	return true;
}

int FIgiUnrealSocket::Recv(uint8_t* Buffer, size_t Capacity, int TimeoutMs)
{
	if (Socket == nullptr)
	{
		return -1;
	}
	int32 Waited = 0;
	while (true)
	{
		if (Socket->Wait(ESocketWaitConditions::WaitForRead, FTimespan::FromMilliseconds(SliceMs)))
		{
			int32 Read = 0;
			if (!Socket->Recv(Buffer, static_cast<int32>(FMath::Min<size_t>(Capacity, 1 << 20)), Read))
			{
				return -1;
			}
			// readable with no bytes: the peer closed
			if (Read == 0 && Socket->GetConnectionState() != SCS_Connected)
			{
				return -1;
			}
			return Read;
		}
		if (Socket->GetConnectionState() == SCS_ConnectionError)
		{
			return -1;
		}
		Waited += SliceMs;
		if (bWake.exchange(false) || Waited >= TimeoutMs)
		{
			return 0;
		}
	}
}

void FIgiUnrealSocket::Close()
{
	if (Socket != nullptr)
	{
		Socket->Close();
		ISocketSubsystem::Get(PLATFORM_SOCKETSUBSYSTEM)->DestroySocket(Socket);
		Socket = nullptr;
	}
}
